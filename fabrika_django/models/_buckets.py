"""The shared rate limits' state: one token bucket row per job declared with ``rate_limit`` (``_runs.ratelimit``)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class RateBucket(models.Model):
    """A rate-limited job's token bucket: the tokens it held at ``updated``, refilled lazily as each claim reads it.

    Made full by the job's first claim; each claim locks it, takes a token per row it claims and writes it back
    in the claim's own transaction, so every run of the job, in every lane, worker and host, shares it.
    """

    job = models.CharField(_("job"), max_length=100, primary_key=True)
    tokens = models.FloatField(_("tokens"))
    updated = models.DateTimeField(_("updated"))

    class Meta:
        verbose_name = _("rate bucket")
        verbose_name_plural = _("rate buckets")

    def __str__(self) -> str:
        return f"{self.job}: {self.tokens:.2f} tokens"
