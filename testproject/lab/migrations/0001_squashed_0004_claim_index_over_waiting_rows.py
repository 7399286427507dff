"""This app's tables as 0001_initial … 0004_claim_index_over_waiting_rows leave them, in one migration:
a new database runs only this one; one at any of those runs the rest of them."""

import django.utils.timezone
from django.db import migrations, models

import testproject.lab.storage


class Migration(migrations.Migration):
    replaces = [
        ("lab", "0001_initial"),
        ("lab", "0002_document"),
        ("lab", "0003_effect"),
        ("lab", "0004_claim_index_over_waiting_rows"),
    ]

    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Mark",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("job", models.CharField(max_length=100)),
                ("note", models.CharField(max_length=100)),
                ("pid", models.IntegerField(default=0)),
                ("attempt", models.PositiveIntegerField(default=0)),
                ("at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "ordering": ["pk"],
            },
        ),
        migrations.CreateModel(
            name="Document",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "file",
                    models.FileField(blank=True, storage=testproject.lab.storage.private_storage, upload_to="docs/"),
                ),
            ],
        ),
        migrations.CreateModel(
            name="Effect",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("item", models.BigIntegerField(unique=True)),
                ("pid", models.IntegerField(default=0)),
                ("at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.CreateModel(
            name="Item",
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
                ("n", models.PositiveIntegerField(default=0)),
                ("writes", models.PositiveIntegerField(default=0)),
            ],
            options={
                "abstract": False,
                "indexes": [
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__lt", 10)),
                        fields=["due", "id"],
                        name="lab_item_due_d83f7b_idx",
                    ),
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__gte", 10)),
                        fields=["id"],
                        name="lab_item_id_372553_idx",
                    ),
                ],
            },
        ),
    ]
