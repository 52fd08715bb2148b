"""Reading and presenting Strata's HDF5 reports (schema strata-report v1).

read: open a report and hand out its tables; summary: the text tables;
plots: timeline, memory and communication pictures; trace: Chrome/Perfetto
trace JSON; compare: two runs side by side.
"""
