"""The Dash dashboard: `python -m dashboard --traces DIR` (run list, one run's findings next to its timeline and
memory, two runs compared). Entry points: dashboard.app.main and dashboard.app.create_app."""
