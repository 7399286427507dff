"""This app's tables as 0001_initial … 0002_claim_index_over_waiting_rows leave them, in one migration:
a new database runs only this one; one at any of those runs the rest of them."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    replaces = [("reminders", "0001_initial"), ("reminders", "0002_claim_index_over_waiting_rows")]

    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Reminder",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("attempts", models.PositiveIntegerField(default=0, editable=False, verbose_name="attempts")),
                (
                    "due",
                    models.DateTimeField(
                        blank=True, default=django.utils.timezone.now, editable=False, null=True, verbose_name="due"
                    ),
                ),
                ("version", models.PositiveIntegerField(default=0, editable=False, verbose_name="version")),
                (
                    "last_failure",
                    models.CharField(
                        blank=True, default="", editable=False, max_length=64, verbose_name="last failure"
                    ),
                ),
                ("note", models.CharField(max_length=200)),
                ("email", models.EmailField(max_length=254)),
                ("sent_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "abstract": False,
                "indexes": [
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__lt", 3)),
                        fields=["due", "id"],
                        name="reminders_r_due_71dd04_idx",
                    ),
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__gte", 3)),
                        fields=["id"],
                        name="reminders_r_id_709f49_idx",
                    ),
                ],
            },
        ),
    ]
