# A model with a storage of its own, for the file sweep.

import testproject.lab.storage
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('lab', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='Document',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('file', models.FileField(blank=True, storage=testproject.lab.storage.private_storage, upload_to='docs/')),
            ],
        ),
    ]
