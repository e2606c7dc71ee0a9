"""Application services, one module per job: sweep, verify, formulas, recommend, report. They
return data (records, reports); `cpbench.render` turns it into tables and pages."""
