"""The data pipeline over the state journal.

:mod:`iqbridge.analytics.export` turns any index store's journal into Parquet, a page at
a time and incrementally (a watermark per store); the Spark jobs read that directory and
answer the operators' questions:

- :mod:`~iqbridge.analytics.audit`: once-only violations, lost messages, deliveries stuck
  in doubt, publisher/subscriber inconsistencies;
- :mod:`~iqbridge.analytics.latency`: REVEALED to DONE percentiles, time in each state,
  throughput per hour, with an HTML report;
- :mod:`~iqbridge.analytics.lineage`: parent/child trees across queues and brokers,
  orphans, and the plan seed 000's cross-queue recovery would apply;
- :mod:`~iqbridge.analytics.retention`: the archive of journalled messages past their rule
  and the purge plan ``iq purge --from-plan`` applies.

The jobs use the DataFrame API only (no Python UDFs), so executors on a cluster need
PySpark and nothing of iqbridge. Run them with ``iq analytics JOB`` or ``spark-submit``
(see docs/analytics.md). PySpark, pyarrow and matplotlib come with the ``spark`` extra.
"""
