from django.db import models

from fabrika_django.models import QueueModel

from .storage import private_storage


class Mark(models.Model):
    """A line a lab job writes, so a test in another process can see what ran and when."""

    job = models.CharField(max_length=100)
    note = models.CharField(max_length=100)
    pid = models.IntegerField(default=0)
    attempt = models.PositiveIntegerField(default=0)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.job} {self.note}"


class Item(QueueModel):
    """A queue row for the crash and concurrency tests; ``writes`` counts how often a job finished it."""

    n = models.PositiveIntegerField(default=0)
    writes = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"Item {self.pk}"


class Document(models.Model):
    """A file in a storage of its own (``storage.PrivateStorage``): the sweep must see its names as that storage's."""

    file = models.FileField(upload_to="docs/", storage=private_storage, blank=True)

    def __str__(self) -> str:
        return f"Document {self.pk}"


class Effect(models.Model):
    """The one external effect a chaos run makes per Item: the unique key turns a second one into an error."""

    item = models.BigIntegerField(unique=True)
    pid = models.IntegerField(default=0)
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Effect of item {self.item}"


class Taken(models.Model):
    """A row the rate-limited lab job claimed, with the ``due`` its claim wrote: the claim's time plus the row's
    first backoff, the same for every first claim, so windows of ``due`` are windows of claim times."""

    item = models.BigIntegerField(unique=True)
    due = models.DateTimeField()
    pid = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"Item {self.item} taken"


class Parcel(QueueModel):
    """A queue row with a JSON column, for the claim of a row whose value cannot be read back."""

    contents = models.JSONField(default=dict)

    class Queue:
        max_attempts = 4

    def __str__(self) -> str:
        return f"Parcel {self.pk}"
