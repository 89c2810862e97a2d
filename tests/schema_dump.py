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
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = %(schema)s
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relkind = 'r'
GROUP BY c.relname
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ': ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = %(schema)s::regnamespace
UNION ALL
SELECT 'index ' || pg_get_indexdef(indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relnamespace = %(schema)s::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid) FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
WHERE NOT t.tgisinternal AND c.relnamespace = %(schema)s::regnamespace
UNION ALL
SELECT 'function ' || p.proname || '(' || pg_get_function_arguments(p.oid) || ') returns '
    || pg_get_function_result(p.oid)
    || coalesce(' set ' || array_to_string(p.proconfig, ', '), '')
FROM pg_proc p WHERE p.pronamespace = %(schema)s::regnamespace
ORDER BY 1
"""


def dump(url: str, schema: str = "jobfence") -> str:
    """Every table, constraint, index, trigger and function of ``schema``."""
    with psycopg.connect(url) as conn:
        return "\n".join(r[0] for r in conn.execute(CATALOG, {"schema": schema})) + "\n"


if __name__ == "__main__":
    sys.stdout.write(dump(sys.argv[1]))
