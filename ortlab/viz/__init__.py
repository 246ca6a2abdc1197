"""Seeing graphs: Netron on 127.0.0.1 beside a static picture of the graph, tables and curves.

- `show(model)`: Netron served on loopback and shown inline (`netron.py`), with a picture of the
  graph's structure that a stored notebook keeps (`picture.py`);
- `Table`, `node_table`, `plot_curves`: what notebooks print and plot (`tables.py`).
"""
from ortlab.viz.netron import HOST, MAX_SERVERS, NetronView, VizError, running, show, stop_all
from ortlab.viz.tables import Table, node_table, plot_curves

__all__ = ["HOST", "MAX_SERVERS", "NetronView", "Table", "VizError", "node_table", "plot_curves",
           "running", "show", "stop_all"]
