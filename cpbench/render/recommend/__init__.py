"""Rich renderables and words of the recommend, calibrate and validate reports (the dicts that
`cpbench.app.recommend` and `cpbench.app.calibrate` return), one module per job."""
