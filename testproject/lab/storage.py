"""A storage of the lab's own, for the file sweep's tests: a folder inside MEDIA_ROOT with its own names."""

import os
from functools import cached_property

from django.conf import settings
from django.core.files.storage import FileSystemStorage


class PrivateStorage(FileSystemStorage):
    """``MEDIA_ROOT/private``: its names ("x.pdf") are "private/x.pdf" to the default storage."""

    @cached_property
    def base_location(self):  # cleared with MEDIA_ROOT, as FileSystemStorage's own is
        return os.path.join(settings.MEDIA_ROOT, "private")


_private = PrivateStorage()


def private_storage():
    return _private
