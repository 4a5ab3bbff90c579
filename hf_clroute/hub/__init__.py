"""Files and the Hub: atomic writes, an adapter's file names, Hub calls and pushes."""
