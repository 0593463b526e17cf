"""The host side of a run: detectors over each observed step, persistence, and the events they become."""
