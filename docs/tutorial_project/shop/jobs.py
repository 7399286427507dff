from django.utils import timezone

from fabrika_django import cron

from . import carrier
from .models import Shipment


@cron("*/5 * * * *")  # every five minutes (UTC); a kick runs it sooner
def ship_orders(ctx):
    for shipment in Shipment.objects.claim(limit=50):  # due rows, each charged one attempt
        with ctx.row(shipment, step="book_pickup"):  # a failure here is this row's, not the batch's
            ctx.signal.throw_if_aborted()
            code = carrier.book_pickup(shipment.order_id, shipment.order.address)
            with ctx.transaction():  # every write of a job goes inside it
                shipment.order.shipped = timezone.now()
                shipment.order.save(update_fields=["shipped"])
                shipment.finish(tracking_code=code)  # done
