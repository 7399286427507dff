from django.contrib import admin

from fabrika_django.admin import QueueModelAdmin

from .models import Order, Shipment

admin.site.register(Order)
admin.site.register(Shipment, QueueModelAdmin)
