"""This app's tables as 0001_initial … 0004_claim_index_over_waiting_rows leave them, in one migration:
a new database runs only this one; one at any of those runs the rest of them."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    replaces = [
        ("outbox", "0001_initial"),
        ("outbox", "0002_unsubscribe_url"),
        ("outbox", "0003_skipped_at"),
        ("outbox", "0004_claim_index_over_waiting_rows"),
    ]

    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Person",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=200)),
                ("email", models.EmailField(max_length=254, unique=True)),
                ("unsubscribed", models.BooleanField(default=False)),
            ],
        ),
        migrations.CreateModel(
            name="OutboxMail",
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
                ("kind", models.CharField(max_length=32)),
                ("subject", models.CharField(max_length=200)),
                ("text", models.TextField()),
                ("html", models.TextField(blank=True)),
                ("attachment", models.FileField(blank=True, upload_to="outbox/")),
                ("message_id", models.CharField(blank=True, max_length=255)),
                ("created", models.DateTimeField(auto_now_add=True)),
                (
                    "person",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="mails", to="outbox.person"
                    ),
                ),
                ("unsubscribe_url", models.URLField(blank=True, max_length=2000)),
                ("skipped_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "abstract": False,
                "indexes": [
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__lt", 5)),
                        fields=["due", "id"],
                        name="outbox_outb_due_57526d_idx",
                    ),
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__gte", 5)),
                        fields=["id"],
                        name="outbox_outb_id_158116_idx",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="Registration",
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
                ("name", models.CharField(max_length=200)),
                ("email", models.EmailField(max_length=254)),
                ("received_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "abstract": False,
                "indexes": [
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__lt", 5)),
                        fields=["due", "id"],
                        name="outbox_regi_due_c8e493_idx",
                    ),
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__gte", 5)),
                        fields=["id"],
                        name="outbox_regi_id_7c410d_idx",
                    ),
                ],
            },
        ),
    ]
