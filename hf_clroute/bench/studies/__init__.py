"""Studies beside the main tables: headroom, the reproduction table, roofline, threads."""
