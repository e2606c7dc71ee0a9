"""Rich renderables and words of the recommend, calibrate and validate reports (the dicts that
`cpbench.app.recommend` and `cpbench.app.calibrate` return), by job:

- screen.py: `render_recommendation`, the ranked and rejected tables and the settings table;
- explanation.py: the pick and why in three sentences (`why_lines`), the full explanation
  (`explanation_text`) and where a mesh's groups sit (`placement_text`);
- frameworks.py: the words of each framework caveat (`CAVEATS`, `setting_note`);
- calibration.py: `render_calibration` and `render_validation`.
"""
