"""The report as a reader sees it: report.md and the terminal headline (`markdown`), and the PNGs (`figures`)."""
