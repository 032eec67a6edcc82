"""Scheduler layer: lookups, touch, load/store jobs and their completion."""
