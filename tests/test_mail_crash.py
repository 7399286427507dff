"""A worker process killed between the SMTP server's acceptance and the ledger's write, then a retry.

Over plain SMTP the retry is reported ``unknown`` and sends nothing; over a transport that deduplicates, the retry
asks it again and the relay drops the copy: either way the message arrives once.
"""

import signal
import time

import pytest

from fabrika_django.models import Attempt, SentMail
from testproject.lab.models import Mark

from .processes import start_manage
from .smtp import SMTPServer

LEASE_SECONDS = 1


def _run_lab_mail(smtp, backend):
    process = start_manage(
        "fabrika_job",
        "run",
        "lab_mail",
        EMAIL_URL=f"smtp://127.0.0.1:{smtp.port}",
        EMAIL_BACKEND=backend,
        FABRIKA_LEASE_SECONDS=LEASE_SECONDS,
    )
    out, err = process.communicate(timeout=60)
    return process.returncode, err


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("dedup", "dying", "retrying", "retry_note", "ledger"),
    [
        (
            False,
            "testproject.lab.mail.DiesAfterAcceptanceSMTPBackend",
            "django.core.mail.backends.smtp.EmailBackend",
            "outcome_unknown:unknown:False",
            "unknown",
        ),
        (
            True,
            "testproject.lab.mail.DedupDiesAfterAcceptanceSMTPBackend",
            "testproject.lab.mail.DeduplicatingSMTPBackend",
            "accepted",
            "accepted",
        ),
    ],
    ids=["plain-smtp", "deduplicating-relay"],
)
def test_a_process_killed_after_acceptance_never_delivers_the_message_twice(dedup, dying, retrying, retry_note, ledger):
    with SMTPServer(dedup=dedup) as smtp:
        code, err = _run_lab_mail(smtp, dying)
        assert code == -signal.SIGKILL, err
        assert len(smtp.received) == 1
        assert SentMail.objects.get().state == "sending"  # the acceptance never reached the ledger
        assert not Mark.objects.exists()

        time.sleep(LEASE_SECONDS + 0.5)  # the killed attempt's lease runs out
        code, err = _run_lab_mail(smtp, retrying)
        assert code == 0, err
        assert len(smtp.received) == 1
    assert list(Mark.objects.values_list("note", flat=True)) == [retry_note]
    assert SentMail.objects.get().state == ledger
    assert sorted(Attempt.objects.values_list("outcome", flat=True)) == ["crashed", "succeeded"]
