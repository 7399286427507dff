from django.db import models

from fabrika_django.models import QueueModel


class Order(models.Model):
    address = models.CharField(max_length=200)
    placed = models.DateTimeField(auto_now_add=True)
    shipped = models.DateTimeField(null=True, blank=True)


class Shipment(QueueModel):
    """One order to hand to the carrier: a row of work, waiting until the job finishes it."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    tracking_code = models.CharField(max_length=40, blank=True)

    class Queue:
        max_attempts = 3  # three claims, then the row is dead: kept for a person to look at
