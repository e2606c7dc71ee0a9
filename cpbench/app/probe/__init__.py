"""`cpbench probe`: measure this machine's links and local attention kernel, and write a
hardware profile from them, in under a minute. By job:

- plan.py: the settings (`ProbeSettings`, `default_settings`) and the tests they make
  (`make_plan`: collectives at the configurations' message sizes, kernel shapes);
- ranks.py: what every rank runs (`probe_on_rank`): the timed collectives and kernels;
- fit.py: the measurements in nccl-tests terms and the link lines fitted to them (`fit_links`);
- profile.py: the prior with the measured numbers (`measured_profile`);
- run.py: the whole probe (`run_probe`) and its JSON document (`probe_report`).
"""
