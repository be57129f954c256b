"""The simulator: traces, generated workloads, replay through the manager, bounds, sweeps, reports.

Above the manager and the policies (it drives them); nothing below imports it.
"""
