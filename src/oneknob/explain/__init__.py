"""Stage 7, explain: runs read back from MLflow -> what each transition tracks, confounds, what a variant did
to the baseline, report.md, summary.json, plots and the MLflow UI's pages.
May import: every stage below (record, verdict, plan, config) and the leaves; never study or cli.
"""
