"""How many connections the history digest reads its chunks on: the one place the default and the bound live.

Light on purpose (no SQLAlchemy): the DAG form declares the field from these at parse time.
"""

#: Connections a digest reads its chunks on at once (MySQL-protocol servers; SQLite reads on one).
DEFAULT_DIGEST_CONNECTIONS = 4
#: The bound: each is a connection of the tenant's server held for the digest's length.
MAX_DIGEST_CONNECTIONS = 16
