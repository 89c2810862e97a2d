"""A stable text dump of the schema the migrations produce, compared against
tests/integration/expected_schema.txt (regenerate with `make schema-snapshot`)."""

from __future__ import annotations

import sys

import psycopg

CATALOG = """
SELECT 'table ' || c.relname || E'\n' || string_agg(
    '  ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
    || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
    || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), ''), E'\n' ORDER BY a.attnum)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relkind = 'r'
GROUP BY c.relname
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ': ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace
UNION ALL
SELECT 'index ' || pg_get_indexdef(indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal
UNION ALL
SELECT 'function ' || p.proname || '(' || pg_get_function_arguments(p.oid) || ') returns '
    || pg_get_function_result(p.oid)
FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
ORDER BY 1
"""


def dump(url: str) -> str:
    with psycopg.connect(url) as conn:
        return "\n".join(r[0] for r in conn.execute(CATALOG)) + "\n"


if __name__ == "__main__":
    sys.stdout.write(dump(sys.argv[1]))
