from omnigym.track.run import Run

__all__ = ["Run"]
