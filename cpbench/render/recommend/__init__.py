"""Rich renderables and words of the recommend, calibrate and validate reports (what
`cpbench.app.recommend` and `cpbench.app.calibrate` return), one module per job."""
