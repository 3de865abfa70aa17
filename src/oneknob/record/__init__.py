"""Stage 6, record: the journal, the point cache and stored references on disk; MLflow through MlflowClient;
the tags every run carries; sync of journals MLflow lacks, and a one-job run's upload trailing its journal.
May import: verdict, config and the leaves.
"""
