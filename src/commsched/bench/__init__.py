"""``commsched bench``: the harness that measures policies side by side on the emulated cluster.

* :mod:`commsched.bench.run`: sessions, repeats, the JSON report (:func:`run_bench`), with
  :mod:`commsched.bench.config` (what a run measures), :mod:`commsched.bench.collect` (the ranks'
  results merged), :mod:`commsched.bench.summary` (iteration times, ratios and their definitions)
  and :mod:`commsched.bench.provenance` (the checkout and the machine);
* :mod:`commsched.bench.worker`: what each rank runs (``python -m commsched.bench.worker JOB.json``),
  with :mod:`commsched.bench.job` (its task) and :mod:`commsched.bench.calibrate_task` (the
  measurements the simulator predicts from; :mod:`commsched.bench.overlap` among them);
* :mod:`commsched.bench.baselines`: the PyTorch DDP configurations measured beside the policies
  (default DDP, best DDP);
* :mod:`commsched.bench.calibrate` and :mod:`commsched.bench.validate`: ``--validate``, the
  simulator calibrated on the same links and its predictions beside the measurement;
* :mod:`commsched.bench.report`: tables and the bar chart.

The cluster itself (namespaces, shaped links, launching) is :mod:`commsched.testbed`.
Nothing is imported here, so that ``python -m commsched.bench.worker`` runs the
worker module once.
"""
