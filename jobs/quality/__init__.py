"""The validation job's parts: the Great Expectations suite, the verdict on its Data Docs,
and the offline copies of the pages' assets."""
