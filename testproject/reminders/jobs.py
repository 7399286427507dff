"""Recipe 2, a per-record reminder: each minute, the reminders whose time has come are sent and finished."""

from datetime import timedelta

from fabrika_django import VersionConflict, cron

from .models import Reminder


@cron("* * * * *", timeout=timedelta(minutes=2), actions=["reminders.change_reminder"])
def send_reminders(ctx):
    """Claim due reminders, "send" each (the demo logs its id), and mark it sent."""
    for reminder in Reminder.objects.claim(limit=50):
        ctx.signal.throw_if_aborted()
        ctx.log.info("Reminder due id=%s", reminder.pk)
        try:
            with ctx.transaction():
                reminder.finish(sent_at=ctx.now())
        except VersionConflict:
            # Moved by a person since the claim: it waits for its new time.
            ctx.log.info("Reminder moved meanwhile id=%s", reminder.pk)
