"""The tables: each format's writer and reader (Delta, Parquet), and the file system calls
that commit to them."""
