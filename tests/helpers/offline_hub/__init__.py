"""Offline stand-ins for the ``datasets`` and ``evaluate`` packages, for running Accelerate's example scripts without
the network: put this directory on ``sys.path`` (``PYTHONPATH``) of the process that runs a script, and set
``OFFLINE_HUB_DATA`` to the folder `tests.helpers.accelerate_examples.build_offline_hub` wrote."""
