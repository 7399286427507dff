"""Lanes (``cron(lanes=N)``): one lease per (job, lane), and each attempt's lane.

The lease table is made anew rather than altered: its primary key moves from the job's name to an id of its
own, which no backend alters in place cheaply, and its rows are only the state of runs in progress, which
every worker and run makes again as it needs them. Stop the workers while this migrates: a run active
across it loses its lease (``lease_lost``) and its job runs again.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fabrika_django', '0006_attempt_hours'),
    ]

    operations = [
        migrations.DeleteModel(
            name='Lease',
        ),
        migrations.CreateModel(
            name='Lease',
            fields=[
                ('id', models.AutoField(primary_key=True, serialize=False)),
                ('job', models.CharField(max_length=100, verbose_name='job')),
                ('lane', models.PositiveSmallIntegerField(default=0, verbose_name='lane')),
                ('token', models.UUIDField(blank=True, null=True, unique=True, verbose_name='token')),
                ('holder', models.CharField(blank=True, max_length=200, verbose_name='holder')),
                ('run_id', models.UUIDField(blank=True, null=True, verbose_name='run')),
                ('attempt', models.PositiveIntegerField(default=0, verbose_name='attempt')),
                ('expires', models.DateTimeField(blank=True, null=True, verbose_name='expires')),
            ],
            options={
                'verbose_name': 'lease',
                'verbose_name_plural': 'leases',
                'ordering': ['job', 'lane'],
                'constraints': [models.UniqueConstraint(fields=('job', 'lane'), name='fabrika_lease_job_lane')],
            },
        ),
        migrations.AddField(
            model_name='job',
            name='lane_asked',
            field=models.DateTimeField(blank=True, null=True, verbose_name='one more lane asked'),
        ),
        migrations.AddField(
            model_name='attempt',
            name='lane',
            field=models.PositiveSmallIntegerField(default=0, verbose_name='lane'),
        ),
    ]
