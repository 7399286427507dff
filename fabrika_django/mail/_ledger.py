"""The idempotency ledger: one ``SentMail`` row per key hash, reserved before a send and accepted after it."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from .._running import framework_write
from .._sql import mail as sql
from ..conf import settings
from ..exceptions import EmailDeliveryError

_KEY = re.compile(r"[\x21-\x7e]{1,200}")


@dataclass(frozen=True)
class SendResult:
    """A message the transport accepted (or accepted earlier under the same idempotency key)."""

    status: str
    provider: str
    message_id: str


def check_key(key: object) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise EmailDeliveryError(
            "The idempotency key must be 1 to 200 visible ASCII characters, derived from the row "
            "(e.g. f'outbox-mail-{row.pk}'), never random.",
            code="invalid_idempotency_key",
        )
    return key


def key_hash(key: str) -> str:
    return hashlib.sha256(f"{settings.ENVIRONMENT or ''}\0{key}".encode()).hexdigest()


class Ledger:
    """The SentMail row of one key: reserved before the send, accepted after it, freed when nothing left."""

    def __init__(self, key_hash: str, content_hash: str) -> None:
        self.key_hash = key_hash
        self.content_hash = content_hash

    def reserve(self, provider: str, *, deduplicates: bool) -> SendResult | None:
        """Mark the key ``sending``; answer the earlier acceptance instead, or refuse, when it was used."""
        from ..models._tables import SentMail

        for _ in range(3):  # a concurrent try can move the row between the read and the write
            if self._insert_sending(provider):
                return None
            row = SentMail.objects.filter(key_hash=self.key_hash).first()
            if row is None:
                continue  # freed meanwhile: reserve again
            if row.content_hash != self.content_hash:
                raise EmailDeliveryError(
                    "This idempotency key was used for another message: derive a key per message "
                    "(a new row, a new key), never reuse one for changed content.",
                    code="idempotency_conflict",
                )
            if row.state == "accepted":
                return SendResult(status="accepted", provider=row.provider, message_id=row.message_id)
            if row.state == "sending" and not deduplicates:
                # An earlier try started this send and never recorded its end: it died during the call, or is
                # in it now. Only the transport knows whether the message left, and it cannot tell us.
                self._move("sending", "unknown")
                raise EmailDeliveryError(
                    "An earlier try of this message ended during the send: it may have left. Check, then "
                    "requeue the row to send it again.",
                    code="outcome_unknown",
                    outcome="unknown",
                )
            if row.state == "sending" or self._move(row.state, "sending"):
                # The transport deduplicates (ask it again), or a person requeued an unknown one: send.
                return None
        raise EmailDeliveryError(
            "Another try is sending this message right now: a later run answers its outcome.",
            code="outcome_unknown",
            outcome="unknown",
        )

    def _insert_sending(self, provider: str) -> bool:
        """Insert the key's row as ``sending``; False when the key has a row already. One statement, no exception.

        PostgreSQL and SQLite say so with ``ON CONFLICT DO NOTHING RETURNING``, MariaDB and MySQL with
        ``INSERT IGNORE`` and its row count; other databases take the IntegrityError path inside a savepoint.
        """
        from django.db import connections, router
        from django.utils import timezone

        from ..models._tables import SentMail

        alias = router.db_for_write(SentMail)
        connection = connections[alias]
        table = connection.ops.quote_name(SentMail._meta.db_table)
        values = [self.key_hash, self.content_hash, provider, connection.ops.adapt_datetimefield_value(timezone.now())]
        with framework_write():
            if connection.vendor in ("postgresql", "sqlite"):
                with connection.cursor() as cursor:
                    cursor.execute(sql.INSERT_SENDING_RETURNING.format(table=table), values)
                    return cursor.fetchone() is not None
            provider_fits = len(provider) <= SentMail._meta.get_field("provider").max_length  # type: ignore[operator]
            if connection.vendor == "mysql" and provider_fits:
                # IGNORE is used only when every value fits: two fixed-length hashes and a provider name checked
                # above. Then the one row it can skip is a duplicate key: a row count of 0 says the key has a row.
                with connection.cursor() as cursor:
                    cursor.execute(sql.INSERT_SENDING_IGNORE.format(table=table), values)
                    return cursor.rowcount == 1
            try:
                with transaction.atomic(using=alias):
                    SentMail.objects.using(alias).create(
                        key_hash=self.key_hash, content_hash=self.content_hash, state="sending", provider=provider
                    )
                return True
            except IntegrityError:
                return False

    def accepted(self, result: SendResult) -> None:
        from django.utils import timezone

        from ..models._tables import SentMail

        with framework_write():  # one statement: its own transaction
            SentMail.objects.filter(key_hash=self.key_hash).update(
                state="accepted", provider=result.provider, message_id=result.message_id, accepted=timezone.now()
            )

    def unknown(self) -> None:
        self._move("sending", "unknown")

    def release(self) -> None:
        """Forget the reservation: the message did not leave, so the next try sends it afresh."""
        from ..models._tables import SentMail

        with framework_write():
            SentMail.objects.filter(key_hash=self.key_hash, state="sending", content_hash=self.content_hash).delete()

    def _move(self, old: str, new: str) -> bool:
        from ..models._tables import SentMail

        with framework_write():
            return bool(SentMail.objects.filter(key_hash=self.key_hash, state=old).update(state=new))
