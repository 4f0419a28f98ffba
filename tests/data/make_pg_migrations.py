"""Write the PostgreSQL schema's migrations, as the checkout on PYTHONPATH has them, to a
JSON list (one SQL text per version): what that release ran to build each schema version.

    PYTHONPATH=/tmp/q-old python3 tests/data/make_pg_migrations.py tests/data/pg-migrations-28.json
"""

import json
import sys

from queickd.store.postgres.schema import MIGRATIONS

with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump(MIGRATIONS, f, indent=0)
    f.write("\n")
