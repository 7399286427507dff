"""The demo's mail settings in either form: Django's EMAIL_* settings, or MAILERS (Django 6.1 and later)."""

import django

# EMAIL_* setting -> the option of a MAILERS entry (the backend's keyword argument).
_OPTIONS = {
    "EMAIL_HOST": "host",
    "EMAIL_PORT": "port",
    "EMAIL_HOST_USER": "username",
    "EMAIL_HOST_PASSWORD": "password",
    "EMAIL_USE_TLS": "use_tls",
    "EMAIL_USE_SSL": "use_ssl",
    "EMAIL_TIMEOUT": "timeout",
    "EMAIL_SSL_CERTFILE": "ssl_certfile",
    "EMAIL_SSL_KEYFILE": "ssl_keyfile",
    "EMAIL_FILE_PATH": "file_path",
}


def mailers_setting(email: dict) -> dict:
    """MAILERS with one default mailer made from EMAIL_* settings (unset, empty and false ones left out:
    a backend refuses options it does not know, and the console backend knows no host)."""
    options = {
        _OPTIONS[name]: value for name, value in email.items() if name in _OPTIONS and value not in (None, "", False)
    }
    return {"default": {"BACKEND": email["EMAIL_BACKEND"], "OPTIONS": options}}


def mail_settings(**email) -> dict:
    """Settings that make ``email`` (EMAIL_* names) the installation's mailer on this Django: for
    ``override_settings(**mail_settings(EMAIL_BACKEND=..., EMAIL_HOST=...))``."""
    if django.VERSION >= (6, 1):
        return {"MAILERS": mailers_setting(email)}
    return email
