"""This app's tables as 0001_initial … 0002_claim_index_over_waiting_rows leave them, in one migration:
a new database runs only this one; one at any of those runs the rest of them."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    replaces = [("reports", "0001_initial"), ("reports", "0002_claim_index_over_waiting_rows")]

    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="ReportRequest",
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
                ("rows", models.PositiveIntegerField(default=100)),
                ("result", models.FileField(blank=True, upload_to="reports/")),
                ("requested_at", models.DateTimeField(auto_now_add=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "abstract": False,
                "indexes": [
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__lt", 10)),
                        fields=["due", "id"],
                        name="reports_rep_due_9c36f9_idx",
                    ),
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__gte", 10)),
                        fields=["id"],
                        name="reports_rep_id_9df722_idx",
                    ),
                ],
            },
        ),
    ]
