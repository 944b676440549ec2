"""What a run did and will do, from its inputs and its run log: run accounting
(:class:`~zephon_store.runs.accounting.RunContext`), ``trace``/``where``/``audit``
(:mod:`~zephon_store.runs.audit`), the ``zephon plan`` simulator and a mixture's plan. Above
``load``: each answer comes from the loader's own order code with the run's inputs."""
