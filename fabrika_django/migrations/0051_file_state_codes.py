# Outcome codes fetch_too_large, file_not_ready, file_rejected; an index for pruning the mail ledger by age.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fabrika_django', '0005_outcome_codes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='attempt',
            name='outcome',
            field=models.CharField(choices=[('running', 'running'), ('succeeded', 'succeeded'), ('handler_failed', 'handler failed'), ('timed_out', 'timed out'), ('lease_lost', 'lease lost'), ('shutdown', 'worker shut down'), ('crashed', 'crashed (holder vanished)'), ('write_outside_transaction', 'write outside transaction'), ('claim_inside_transaction', 'claim inside transaction'), ('claim_outside_job', 'claim outside job'), ('undeclared_kick', 'undeclared kick'), ('capability_refused', 'capability refused'), ('unknown_job', 'unknown job'), ('version_conflict', 'version conflict'), ('token_invalid', 'token invalid'), ('token_expired', 'token expired'), ('egress_refused', 'egress refused'), ('fetch_failed', 'fetch failed'), ('fetch_too_large', 'fetch too large'), ('mail_not_configured', 'mail not configured'), ('invalid_message', 'invalid message'), ('invalid_idempotency_key', 'invalid idempotency key'), ('idempotency_conflict', 'idempotency conflict'), ('send_inside_transaction', 'send inside transaction'), ('attachments_too_large', 'attachments too large'), ('file_missing', 'attachment file missing'), ('file_not_ready', 'attachment file not ready'), ('file_rejected', 'attachment file rejected'), ('recipient_refused', 'recipient refused'), ('sender_refused', 'sender refused'), ('message_rejected', 'message rejected'), ('transport_refused', 'transport refused'), ('transport_deferred', 'transport deferred'), ('transport_failed', 'transport failed'), ('transport_unavailable', 'transport unavailable'), ('outcome_unknown', 'outcome unknown')], default='running', max_length=64, verbose_name='outcome'),
        ),
        migrations.AddIndex(
            model_name='sentmail',
            index=models.Index(fields=['created'], name='fabrika_sentmail_created'),
        ),
    ]
