"""Reading runs: pandas analysis, plots, and the HTML reports."""
