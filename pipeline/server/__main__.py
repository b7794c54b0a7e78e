"""`python -m pipeline.server init|start|stop|status|add-student`: the class server (pipeline.server.command)."""

from pipeline.server.command import run

if __name__ == "__main__":
    run()
