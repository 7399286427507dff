from datetime import timedelta

from django.test import TestCase
from django.utils import timezone

from fabrika_django.testing import run_job

from .models import Order, Shipment


class ShipOrdersTests(TestCase):
    def test_a_placed_order_is_shipped(self):
        response = self.client.post("/orders/", {"address": "1 Main Street"})
        self.assertEqual(response.status_code, 201)

        result = run_job("ship_orders")

        self.assertTrue(result.ok)
        shipment = Shipment.objects.get()
        self.assertEqual(shipment.state, "done")
        self.assertTrue(shipment.tracking_code.startswith("TRK-"))
        self.assertIsNotNone(shipment.order.shipped)

    def test_an_unreachable_address_ends_dead_and_a_requeue_ships_it(self):
        order = Order.objects.create(address="Nowhere Lane")
        Shipment.objects.create(order=order)

        later = timezone.now()
        for _ in range(3):  # max_attempts: each run claims the row once more
            later += timedelta(hours=1)  # past the row's backoff (5, 10, 20 minutes)
            self.assertTrue(run_job("ship_orders", now=later).ok)  # the row's failure is not the run's
        shipment = Shipment.objects.get()
        self.assertEqual(shipment.state, "dead")
        self.assertEqual(shipment.last_failure, "book_pickup")

        Order.objects.filter(pk=order.pk).update(address="2 Main Street")  # a person fixes the cause
        shipment.requeue()  # what the admin's "Requeue" does
        self.assertTrue(run_job("ship_orders", now=later).ok)
        self.assertEqual(Shipment.objects.get().state, "done")
