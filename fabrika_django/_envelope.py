"""A message checked for ``ctx.mail.send``: addresses, one-line headers, attachments read from FileFields.

Its ``content_hash`` covers everything the idempotency key promises: recipients, subject, bodies, reply-to, from
name, each attachment's name and bytes, and the unsubscribe URL. Error messages never quote a value (it may be an
address) or a file's name.

An attachment is sent only when ``FABRIKA["FILE_STATE"]`` (if set) says its file is live: a pending or quarantined
file fails the send with ``file_not_ready``, a rejected one with ``file_rejected``, before anything is reserved;
a callable that raises fails it with ``file_state_failed`` (its exception's message is never kept), one that answers
something unhashable with ``file_state_invalid``. A file reached through a symbolic link inside its storage's folder
is refused (``file_is_link``), as the file sweep never follows one: the link may point anywhere on the machine.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from email.utils import formataddr, parseaddr
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured, SuspiciousFileOperation, ValidationError
from django.core.files.storage import FileSystemStorage
from django.core.mail import EmailMultiAlternatives
from django.core.validators import validate_email
from django.db.models.fields.files import FieldFile
from django.utils.module_loading import import_string

from .conf import settings
from .exceptions import EmailDeliveryError

MAX_ATTACHMENTS = 20
MAX_RECIPIENTS = 50
_UNSAFE_IN_HEADER = re.compile(r"[\x00-\x20<>\x7f]")
# Control characters but the tab, and what str.splitlines() and Python's email module take for a line break
# (\x0b, \x0c, \x1c-\x1e, \x85, U+2028, U+2029): in a header each either breaks the send or goes out raw.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")
_FILE_STATES = {"live": None, "pending": "file_not_ready", "quarantined": "file_not_ready", "rejected": "file_rejected"}


@dataclass(frozen=True)
class _Attachment:
    name: str
    content: bytes
    mimetype: str


@dataclass(frozen=True)
class Envelope:
    """A checked message: its parts, its attachments' bytes, and the hash of all that the key covers."""

    to: tuple[str, ...]
    subject: str
    text: str
    html: str | None
    reply_to: tuple[str, ...]
    from_name: str | None
    attachments: tuple[_Attachment, ...]
    unsubscribe_url: str | None
    content_hash: str

    @classmethod
    def build(
        cls,
        *,
        to: str | Sequence[str],
        subject: str,
        text: str,
        html: str | None,
        reply_to: str | Sequence[str] | None,
        from_name: str | None,
        attachments: Iterable[FieldFile],
        unsubscribe_url: str | None,
        limit: int,
    ) -> Envelope:
        recipients = _addresses("to", to, required=True)
        replies = _addresses("reply_to", reply_to, required=False)
        _check_text("subject", subject, single_line=True, required=True, max_length=998)
        _check_text("text", text, single_line=False, required=True)
        if html is not None:
            _check_text("html", html, single_line=False, required=False)
        if from_name is not None:
            _check_text("from_name", from_name, single_line=True, required=False, max_length=100)
        if unsubscribe_url is not None:
            _check_unsubscribe_url(unsubscribe_url)
        files = _read_attachments(attachments, limit)
        content = {
            "to": recipients,
            "subject": subject,
            "text": text,
            "html": html,
            "reply_to": replies,
            "from_name": from_name,
            "attachments": [[f.name, hashlib.sha256(f.content).hexdigest()] for f in files],
            "unsubscribe_url": unsubscribe_url,
        }
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
        return cls(
            to=tuple(recipients),
            subject=subject,
            text=text,
            html=html,
            reply_to=tuple(replies),
            from_name=from_name,
            attachments=files,
            unsubscribe_url=unsubscribe_url,
            content_hash=digest,
        )

    def message(self, *, from_email: str, key_hash: str) -> EmailMultiAlternatives:
        name, address = parseaddr(from_email)
        # Derived from the key, so a transport that deduplicates by Message-ID drops a second copy.
        headers = {"Message-ID": f"<{key_hash[:40]}@{address.rpartition('@')[2] or 'fabrika.invalid'}>"}
        if self.unsubscribe_url:
            # RFC 8058: the pair makes a mailbox offer one-click unsubscribe by POST to the URL.
            headers["List-Unsubscribe"] = f"<{self.unsubscribe_url}>"
            headers["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
        message = EmailMultiAlternatives(
            subject=self.subject,
            body=self.text,
            from_email=formataddr((self.from_name if self.from_name is not None else name, address)),
            to=list(self.to),
            reply_to=list(self.reply_to),
            headers=headers,
        )
        if self.html is not None:
            message.attach_alternative(self.html, "text/html")
        for attachment in self.attachments:
            message.attach(attachment.name, attachment.content, attachment.mimetype)
        return message


def _invalid(text: str) -> EmailDeliveryError:
    return EmailDeliveryError(text, code="invalid_message")


def _addresses(argument: str, value: str | Sequence[str] | None, *, required: bool) -> list[str]:
    if value is None:
        values: list[object] = []
    elif isinstance(value, str):
        values = [value]
    elif isinstance(value, list | tuple):
        values = list(value)
    else:
        raise _invalid(f"{argument} must be an e-mail address or a list of them.")
    if required and not values:
        raise _invalid(f"{argument} names no recipient: give at least one e-mail address.")
    if len(values) > MAX_RECIPIENTS:
        raise _invalid(f"{argument} names {len(values)} addresses: send at most {MAX_RECIPIENTS} per message.")
    for position, address in enumerate(values, start=1):
        try:
            if not isinstance(address, str):
                raise ValidationError("not a string")
            validate_email(address)
        except ValidationError:
            # Never quote the value: it may be someone's address.
            raise _invalid(f"{argument}: entry {position} is not an e-mail address.") from None
    return [str(address) for address in values]


def _check_text(argument: str, value: object, *, single_line: bool, required: bool, max_length: int = 0) -> None:
    if not isinstance(value, str):
        raise _invalid(f"{argument} must be a string, not {type(value).__name__}.")
    if required and not value.strip():
        raise _invalid(f"{argument} is empty: every message needs one.")
    if single_line and ("\n" in value or "\r" in value):
        raise _invalid(f"{argument} holds a line break: a header is one line.")
    if single_line and _CONTROL.search(value):
        raise _invalid(f"{argument} holds a control character: a header is one line of text.")
    if max_length and len(value) > max_length:
        raise _invalid(f"{argument} is {len(value)} characters long: keep it to {max_length}.")


def _check_unsubscribe_url(url: object) -> None:
    # Any host the application serves is fine (an intranet name too); what matters is an absolute http(s) URL that
    # stays one header token: no space, control character or angle bracket.
    parts = urlsplit(url) if isinstance(url, str) else None
    if (
        parts is None
        or not isinstance(url, str)
        or len(url) > 2000
        or parts.scheme not in ("http", "https")
        or not parts.netloc
        or _UNSAFE_IN_HEADER.search(url)
    ):
        raise _invalid(
            "unsubscribe_url is not an absolute http(s) URL: build it with ctx.url(name, query={'t': token})."
        )


def _read_attachments(attachments: Iterable[FieldFile], limit: int) -> tuple[_Attachment, ...]:
    files = list(attachments)
    if len(files) > MAX_ATTACHMENTS:
        raise _invalid(f"{len(files)} attachments: attach at most {MAX_ATTACHMENTS} files.")
    for position, file in enumerate(files, start=1):
        if not isinstance(file, FieldFile):
            raise _invalid(f"attachment {position} is not a file of a FileField: pass row.<file field>.")
        if not file:
            raise EmailDeliveryError(
                f"attachment {position} holds no file: leave it out or wait until the row has its file.",
                code="file_missing",
            )
        if _CONTROL.search(os.path.basename(str(file.name))):
            raise _invalid(f"attachment {position}'s file name holds a control character: rename the file.")
    _check_file_states(files)
    total = 0
    for position, file in enumerate(files, start=1):
        try:
            _refuse_link(position, file)
            total += file.size
        except SuspiciousFileOperation:
            raise _outside(position) from None
        except (FileNotFoundError, OSError):
            raise _missing() from None
    if total > limit:
        raise EmailDeliveryError(
            f"The attachments hold {total} bytes; this transport takes at most {limit}: send a link instead.",
            code="attachments_too_large",
        )
    read = []
    for position, file in enumerate(files, start=1):
        stored = str(file.name)
        try:
            with file.storage.open(stored, "rb") as handle:
                content = handle.read()
        except SuspiciousFileOperation:
            raise _outside(position) from None
        except (FileNotFoundError, OSError):
            raise _missing() from None
        name = os.path.basename(stored)
        read.append(_Attachment(name, content, mimetypes.guess_type(name)[0] or "application/octet-stream"))
    return tuple(read)


def _missing() -> EmailDeliveryError:
    return EmailDeliveryError(
        "An attachment's file is missing from its storage: restore it or clear the field, then requeue the row.",
        code="file_missing",
    )


def _outside(position: int) -> EmailDeliveryError:
    # Never quote the name or the storage's path: the error goes to logs and the handler's own messages.
    return _invalid(
        f"attachment {position}'s file name points outside its storage: fix the row's file field, then requeue the row."
    )


def _refuse_link(position: int, file: FieldFile) -> None:
    """Refuse a file of a file system storage reached through a symbolic link below the storage's folder."""
    storage = file.storage
    if not isinstance(storage, FileSystemStorage):
        return
    folder = os.path.abspath(storage.location)
    path = storage.path(str(file.name))  # SuspiciousFileOperation where the name leaves the folder
    here = folder
    for part in os.path.relpath(path, folder).split(os.sep):
        here = os.path.join(here, part)
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            return  # the size or the read says file_missing
        if stat.S_ISLNK(mode):
            raise EmailDeliveryError(
                f"attachment {position}'s file is a symbolic link inside its storage; nothing was sent: "
                "store the file itself in the field, then requeue the row.",
                code="file_is_link",
            )


def _check_file_states(files: list[FieldFile]) -> None:
    """Ask ``FABRIKA["FILE_STATE"]`` about each file; refuse the send unless every one is live."""
    path = settings.FILE_STATE
    if not path:
        return  # no scanner: every existing file is live
    state_of = import_string(path)
    for position, file in enumerate(files, start=1):
        try:
            state = state_of(file)
        except Exception as error:  # noqa: BLE001 - the scanner's own failure, told by class, never by message
            raise EmailDeliveryError(
                f"FABRIKA['FILE_STATE'] raised {type(error).__name__} for attachment {position}; nothing was sent: "
                "a later attempt asks it again.",
                code="file_state_failed",
            ) from None
        try:
            known = state in _FILE_STATES
        except TypeError:  # unhashable: a list, a dict
            raise EmailDeliveryError(
                f"FABRIKA['FILE_STATE'] answered a {type(state).__name__} for attachment {position}; nothing was "
                "sent: return 'live', 'pending', 'quarantined' or 'rejected'.",
                code="file_state_invalid",
            ) from None
        if not known:
            raise ImproperlyConfigured(
                f"FABRIKA['FILE_STATE'] answered a {type(state).__name__} that is no file state: "
                "return 'live', 'pending', 'quarantined' or 'rejected'."
            )
        if _FILE_STATES[state] == "file_not_ready":
            raise EmailDeliveryError(
                f"attachment {position}'s file is not scanned yet or is held back; nothing was sent: "
                "a later attempt sends it once the file is live.",
                code="file_not_ready",
            )
        if _FILE_STATES[state] == "file_rejected":
            raise EmailDeliveryError(
                f"attachment {position}'s file was rejected; nothing was sent: "
                "replace the file or drop the attachment, then requeue the row.",
                code="file_rejected",
            )
