"""fabrika's tables as 0001_initial … 0009_kickrequest leave them, in one migration. A new database runs only
this one; a database at any of the nine runs the rest of them, and then counts this one as applied. The nine
stay beside it for this release."""

import uuid

import django.utils.timezone
from django.db import migrations, models

import fabrika_django.models


class Migration(migrations.Migration):
    replaces = [
        ("fabrika_django", "0001_initial"),
        ("fabrika_django", "0002_sentmail_created"),
        ("fabrika_django", "0003_queuedtask"),
        ("fabrika_django", "0004_claimer"),
        ("fabrika_django", "0005_queuesample"),
        ("fabrika_django", "0006_attempt_hours"),
        ("fabrika_django", "0007_lanes"),
        ("fabrika_django", "0008_claim_index_over_waiting_rows"),
        ("fabrika_django", "0009_kickrequest"),
    ]

    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Job",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False, verbose_name="name")),
                ("pending_since", models.DateTimeField(blank=True, null=True, verbose_name="pending since")),
                ("next_fire", models.DateTimeField(blank=True, null=True, verbose_name="next fire")),
                ("last_run_id", models.UUIDField(blank=True, null=True, verbose_name="last run")),
                (
                    "last_trigger",
                    models.CharField(
                        blank=True,
                        choices=[("schedule", "schedule"), ("kick", "kick"), ("manual", "manual")],
                        max_length=16,
                        verbose_name="last trigger",
                    ),
                ),
                ("last_outcome", models.CharField(blank=True, max_length=64, verbose_name="last outcome")),
                ("last_started", models.DateTimeField(blank=True, null=True, verbose_name="last started")),
                ("last_finished", models.DateTimeField(blank=True, null=True, verbose_name="last finished")),
                ("last_success", models.DateTimeField(blank=True, null=True, verbose_name="last success")),
                ("failures_in_row", models.PositiveIntegerField(default=0, verbose_name="failures in a row")),
                ("lane_asked", models.DateTimeField(blank=True, null=True, verbose_name="one more lane asked")),
            ],
            options={
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="Overview",
            fields=[],
            options={
                "verbose_name": "overview",
                "verbose_name_plural": "overview",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("fabrika_django.job",),
        ),
        migrations.CreateModel(
            name="SentMail",
            fields=[
                (
                    "key_hash",
                    models.CharField(max_length=64, primary_key=True, serialize=False, verbose_name="key hash"),
                ),
                ("content_hash", models.CharField(max_length=64, verbose_name="content hash")),
                ("state", models.CharField(default="sending", max_length=16, verbose_name="state")),
                ("provider", models.CharField(blank=True, max_length=100, verbose_name="provider")),
                ("message_id", models.CharField(blank=True, max_length=255, verbose_name="message id")),
                ("created", models.DateTimeField(default=django.utils.timezone.now, verbose_name="created")),
                ("accepted", models.DateTimeField(blank=True, null=True, verbose_name="accepted")),
            ],
            options={
                "verbose_name": "sent mail",
                "verbose_name_plural": "sent mail",
                "indexes": [models.Index(fields=["created"], name="fabrika_sentmail_created")],
            },
        ),
        migrations.CreateModel(
            name="Claimer",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("queue", models.CharField(help_text="app_label.Model", max_length=200, verbose_name="queue")),
                ("job", models.CharField(max_length=100, verbose_name="job")),
            ],
            options={
                "verbose_name": "claimer",
                "verbose_name_plural": "claimers",
                "constraints": [models.UniqueConstraint(fields=("queue", "job"), name="fabrika_claimer_queue_job")],
            },
        ),
        migrations.CreateModel(
            name="QueueSample",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("queue", models.CharField(max_length=200, verbose_name="queue")),
                ("sampled", models.DateTimeField(default=django.utils.timezone.now, verbose_name="sampled")),
                ("waiting", models.PositiveIntegerField(default=0, verbose_name="waiting")),
                ("due_now", models.PositiveIntegerField(default=0, verbose_name="due now")),
                ("dead", models.PositiveIntegerField(default=0, verbose_name="dead")),
            ],
            options={
                "verbose_name": "queue sample",
                "verbose_name_plural": "queue samples",
                "indexes": [models.Index(fields=["queue", "sampled"], name="fabrika_sample_queue_time")],
            },
        ),
        migrations.CreateModel(
            name="FoldedHour",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("hour", models.DateTimeField(unique=True, verbose_name="hour")),
                ("folded", models.DateTimeField(verbose_name="folded")),
                ("running", models.PositiveIntegerField(default=0, verbose_name="running")),
            ],
            options={
                "verbose_name": "folded hour",
                "verbose_name_plural": "folded hours",
            },
        ),
        migrations.CreateModel(
            name="AttemptHour",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("hour", models.DateTimeField(verbose_name="hour")),
                ("job", models.CharField(max_length=100, verbose_name="job")),
                ("succeeded", models.PositiveIntegerField(default=0, verbose_name="succeeded")),
                ("handler_failed", models.PositiveIntegerField(default=0, verbose_name="handler failed")),
                ("timed_out", models.PositiveIntegerField(default=0, verbose_name="timed out")),
                ("interrupted", models.PositiveIntegerField(default=0, verbose_name="interrupted")),
                ("other", models.PositiveIntegerField(default=0, verbose_name="other failure")),
                (
                    "durations",
                    models.TextField(blank=True, help_text="attempts per duration bucket", verbose_name="durations"),
                ),
            ],
            options={
                "verbose_name": "attempt hour",
                "verbose_name_plural": "attempt hours",
                "constraints": [models.UniqueConstraint(fields=("hour", "job"), name="fabrika_attempthour_hour_job")],
            },
        ),
        migrations.CreateModel(
            name="Lease",
            fields=[
                ("id", models.AutoField(primary_key=True, serialize=False)),
                ("job", models.CharField(max_length=100, verbose_name="job")),
                ("lane", models.PositiveSmallIntegerField(default=0, verbose_name="lane")),
                ("token", models.UUIDField(blank=True, null=True, unique=True, verbose_name="token")),
                ("holder", models.CharField(blank=True, max_length=200, verbose_name="holder")),
                ("run_id", models.UUIDField(blank=True, null=True, verbose_name="run")),
                ("attempt", models.PositiveIntegerField(default=0, verbose_name="attempt")),
                ("expires", models.DateTimeField(blank=True, null=True, verbose_name="expires")),
            ],
            options={
                "verbose_name": "lease",
                "verbose_name_plural": "leases",
                "ordering": ["job", "lane"],
                "constraints": [models.UniqueConstraint(fields=("job", "lane"), name="fabrika_lease_job_lane")],
            },
        ),
        migrations.CreateModel(
            name="Attempt",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("job", models.CharField(db_index=True, max_length=100, verbose_name="job")),
                ("run_id", models.UUIDField(db_index=True, verbose_name="run")),
                (
                    "trigger",
                    models.CharField(
                        choices=[("schedule", "schedule"), ("kick", "kick"), ("manual", "manual")],
                        max_length=16,
                        verbose_name="trigger",
                    ),
                ),
                ("number", models.PositiveIntegerField(verbose_name="attempt")),
                ("holder", models.CharField(blank=True, max_length=200, verbose_name="holder")),
                (
                    "started",
                    models.DateTimeField(db_index=True, default=django.utils.timezone.now, verbose_name="started"),
                ),
                ("finished", models.DateTimeField(blank=True, null=True, verbose_name="finished")),
                (
                    "outcome",
                    models.CharField(
                        choices=fabrika_django.models._outcome_choices,
                        default="running",
                        max_length=64,
                        verbose_name="outcome",
                    ),
                ),
                ("error_class", models.CharField(blank=True, max_length=200, verbose_name="exception class")),
                (
                    "frames",
                    models.TextField(
                        blank=True, help_text="file:line of each frame, innermost last", verbose_name="frames"
                    ),
                ),
                (
                    "message",
                    models.TextField(
                        blank=True, help_text="kept only when STORE_ERROR_MESSAGES is on", verbose_name="message"
                    ),
                ),
                ("lane", models.PositiveSmallIntegerField(default=0, verbose_name="lane")),
            ],
            options={
                "verbose_name": "attempt",
                "verbose_name_plural": "attempts",
                "ordering": ["-started", "-id"],
                "indexes": [models.Index(fields=["job", "-started"], name="fabrika_attempt_job_started")],
            },
        ),
        migrations.CreateModel(
            name="QueuedTask",
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
                (
                    "result_id",
                    models.UUIDField(default=uuid.uuid4, editable=False, unique=True, verbose_name="result id"),
                ),
                ("task_path", models.CharField(max_length=255, verbose_name="function")),
                ("backend", models.CharField(max_length=100, verbose_name="backend")),
                ("queue_name", models.CharField(max_length=100, verbose_name="queue")),
                ("priority", models.SmallIntegerField(default=0, verbose_name="priority")),
                ("args", models.JSONField(blank=True, default=list, verbose_name="args")),
                ("kwargs", models.JSONField(blank=True, default=dict, verbose_name="kwargs")),
                ("run_after", models.DateTimeField(blank=True, null=True, verbose_name="run after")),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("READY", "ready"),
                            ("RUNNING", "running"),
                            ("SUCCESSFUL", "successful"),
                            ("FAILED", "failed"),
                        ],
                        default="READY",
                        max_length=10,
                        verbose_name="status",
                    ),
                ),
                ("enqueued_at", models.DateTimeField(default=django.utils.timezone.now, verbose_name="enqueued at")),
                ("started_at", models.DateTimeField(blank=True, null=True, verbose_name="started at")),
                ("last_attempted_at", models.DateTimeField(blank=True, null=True, verbose_name="last attempted at")),
                ("finished_at", models.DateTimeField(blank=True, null=True, verbose_name="finished at")),
                ("return_value", models.JSONField(blank=True, null=True, verbose_name="return value")),
                ("errors", models.JSONField(blank=True, default=list, verbose_name="errors")),
                ("worker_ids", models.JSONField(blank=True, default=list, verbose_name="worker ids")),
            ],
            options={
                "verbose_name": "task",
                "verbose_name_plural": "tasks",
                "indexes": [
                    models.Index(fields=["finished_at"], name="fabrika_task_finished"),
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__lt", 100)),
                        fields=["backend", "queue_name", "-priority", "due", "id"],
                        name="fabrika_task_claim",
                    ),
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__lt", 100)),
                        fields=["due", "id"],
                        name="fabrika_dja_due_66c693_idx",
                    ),
                    models.Index(
                        condition=models.Q(("due__isnull", False), ("attempts__gte", 100)),
                        fields=["id"],
                        name="fabrika_dja_id_7ead63_idx",
                    ),
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("priority__range", (-100, 100))), name="fabrika_task_priority_range"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="KickRequest",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job", models.CharField(max_length=100, verbose_name="job")),
                ("created", models.DateTimeField(default=django.utils.timezone.now, verbose_name="created")),
            ],
            options={
                "verbose_name": "kick request",
                "verbose_name_plural": "kick requests",
                "indexes": [models.Index(fields=["job"], name="fabrika_kick_job")],
            },
        ),
    ]
