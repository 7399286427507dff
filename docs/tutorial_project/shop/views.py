from django.db import transaction
from django.http import HttpResponse
from django.views.decorators.http import require_POST

from fabrika_django import kick

from .models import Order, Shipment


@require_POST
def place_order(request):
    with transaction.atomic():
        order = Order.objects.create(address=request.POST["address"])
        Shipment.objects.create(order=order)
        kick("ship_orders")  # goes out when this transaction commits; a rollback kicks nothing
    return HttpResponse(f"Order {order.pk} placed.\n", status=201)
