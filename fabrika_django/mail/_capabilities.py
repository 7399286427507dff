"""What a job's mail transport does: attachments, the unsubscribe header, a size limit, deduplication, and
what an acceptance means; read from the backend's optional ``fabrika_*`` attributes and Django's own backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_ATTACHMENT_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class Capabilities:
    """``ctx.mail.capabilities``: what the job's transport does."""

    #: It carries attachments.
    attachments: bool
    #: It writes ``List-Unsubscribe`` and ``List-Unsubscribe-Post``.
    unsubscribe_header: bool
    #: The bytes of all attachments of one message together.
    max_attachment_bytes: int
    #: It drops a second message with the same key, so an unknown outcome may be sent again.
    deduplicates: bool
    #: "sent": an acceptance means the provider took it; "queued": a relay or an operator may still hold it.
    confirmation: str


NO_TRANSPORT = Capabilities(
    attachments=False, unsubscribe_header=False, max_attachment_bytes=0, deduplicates=False, confirmation="sent"
)
#: Django's own backends, by module: every one but the dummy writes the whole message, headers and attachments
#: included, wherever it puts it (an SMTP server, stdout, a file, the test outbox); none deduplicates.
_DJANGO_BACKENDS = {
    "smtp": {},
    "console": {},
    "filebased": {},
    "locmem": {},
    "dummy": {"fabrika_attachments": False, "fabrika_unsubscribe_header": False, "fabrika_max_attachment_bytes": 0},
}


def capabilities_of(backend: Any) -> Capabilities:
    known: dict[str, Any] = {}
    for cls in reversed(type(backend).__mro__):
        module = cls.__module__
        if module.startswith("django.core.mail.backends.") and cls.__name__ == "EmailBackend":
            known = _DJANGO_BACKENDS.get(module.rsplit(".", 1)[-1], known)

    def attribute(name: str, default: Any) -> Any:
        return getattr(backend, name, known.get(name, default))

    confirmation = attribute("fabrika_confirmation", "sent")
    return Capabilities(
        attachments=bool(attribute("fabrika_attachments", True)),
        unsubscribe_header=bool(attribute("fabrika_unsubscribe_header", True)),
        max_attachment_bytes=int(attribute("fabrika_max_attachment_bytes", DEFAULT_MAX_ATTACHMENT_BYTES)),
        deduplicates=bool(attribute("fabrika_deduplicates", False)),
        confirmation="queued" if confirmation == "queued" else "sent",
    )
