"""Recipe 3, asynchronous work: a request row is rendered into a CSV file that the request's page offers."""

import csv
import io
from datetime import timedelta

from django.core.files.base import ContentFile

from fabrika_django import VersionConflict, cron

from .models import ReportRequest


def render_csv(rows: int) -> bytes:
    """Return the demo report: a header and ``rows`` numbered lines."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["n", "square"])
    writer.writerows((n, n * n) for n in range(1, rows + 1))
    return out.getvalue().encode()


# Kicked by the page that creates a request; the schedule picks up whatever a lost kick or a crash left.
@cron("*/5 * * * *", timeout=timedelta(minutes=5), actions=["reports.change_reportrequest"])
def render_reports(ctx):
    """Claim report requests, render each into its file, and mark it finished."""
    for request in ReportRequest.objects.claim(limit=10):
        ctx.signal.throw_if_aborted()
        try:
            _render(ctx, request)
        except Exception:
            if ctx.signal.aborted:
                raise  # the attempt's failure, not the row's: the next run meets the row as it is
            # Each request is its own work: keep a fixed step code (never the message) and go on.
            ctx.log.warning("Report failed id=%s", request.pk)
            with ctx.transaction():
                request.record_failure("render")


def _render(ctx, request):
    field = request.result
    name = field.storage.save(
        field.field.generate_filename(request, f"report-{request.pk}.csv"), ContentFile(render_csv(request.rows))
    )
    try:
        with ctx.transaction():
            request.finish(result=name, finished_at=ctx.now())
    except VersionConflict:
        field.storage.delete(name)
        ctx.log.info("Report request changed meanwhile id=%s", request.pk)
        return
    ctx.log.info("Report rendered id=%s rows=%d", request.pk, request.rows)
