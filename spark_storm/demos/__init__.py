"""The demos ``spark-storm demo`` runs: the embedded wordcount and the windowed wordcount (above ``spark``)."""
