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


FULL_CATALOG = """
SELECT 'schema ' || n.nspname || ' owner ' || n.nspowner::regrole::text
    || ' acl ' || coalesce(n.nspacl::text, '-')
    || ' comment ' || coalesce(obj_description(n.oid, 'pg_namespace'), '-')
FROM pg_namespace n WHERE n.nspname = %(schema)s
UNION ALL
SELECT 'relation ' || c.relname || ' kind ' || c.relkind::text || ' owner '
    || c.relowner::regrole::text || ' acl ' || coalesce(c.relacl::text, '-')
    || ' rls ' || c.relrowsecurity || '/' || c.relforcerowsecurity
    || ' persistence ' || c.relpersistence::text
    || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
FROM pg_class c WHERE c.relnamespace = %(schema)s::regnamespace
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
    || ' notnull ' || a.attnotnull || ' identity ' || a.attidentity::text
    || ' generated ' || a.attgenerated::text || ' collation ' || a.attcollation::regcollation::text
    || ' default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-')
    || ' acl ' || coalesce(a.attacl::text, '-')
    || ' comment ' || coalesce(col_description(c.oid, a.attnum), '-')
FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
    AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ': '
    || pg_get_constraintdef(oid) || ' validated ' || convalidated
    || ' deferrable ' || condeferrable || '/' || condeferred
FROM pg_constraint WHERE connamespace = %(schema)s::regnamespace
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid) || ' valid ' || i.indisvalid
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relnamespace = %(schema)s::regnamespace
UNION ALL
SELECT 'sequence ' || s.seqrelid::regclass || ' ' || format_type(s.seqtypid, NULL)
    || ' ' || s.seqstart || ' ' || s.seqincrement || ' ' || s.seqmax || ' ' || s.seqcycle
FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
WHERE c.relnamespace = %(schema)s::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' enabled ' || t.tgenabled::text
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE NOT t.tgisinternal AND c.relnamespace = %(schema)s::regnamespace
UNION ALL
SELECT 'view ' || c.relname || ': ' || pg_get_viewdef(c.oid)
FROM pg_class c WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('v', 'm')
UNION ALL
SELECT 'policy ' || p.tablename || ' ' || p.policyname || ' ' || p.permissive || ' '
    || p.roles::text || ' ' || p.cmd || ' ' || coalesce(p.qual, '-') || ' '
    || coalesce(p.with_check, '-')
FROM pg_policies p WHERE p.schemaname = %(schema)s
UNION ALL
SELECT 'type ' || t.typname || ' ' || t.typtype::text || ' owner ' || t.typowner::regrole::text
FROM pg_type t WHERE t.typnamespace = %(schema)s::regnamespace AND t.typtype IN ('e', 'd')
UNION ALL
SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid)
    || ') owner ' || p.proowner::regrole::text || ' acl ' || coalesce(p.proacl::text, '-')
    || ' secdef ' || p.prosecdef || ' volatile ' || p.provolatile::text
    || ' config ' || coalesce(p.proconfig::text, '-')
    || ' comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
    || E'\n' || pg_get_functiondef(p.oid)
FROM pg_proc p WHERE p.pronamespace = %(schema)s::regnamespace
ORDER BY 1
"""


def catalog(url: str, schema: str = "jobfence") -> list[str]:
    """Everything the catalog says of ``schema``, one entry per object: what two
    installations must agree on to be the same (bodies, settings, ownership, grants,
    policies); nothing that differs between two databases of one server (oids, times)."""
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(FULL_CATALOG, {"schema": schema})]


def first_difference(expected: list[str], actual: list[str]) -> str:
    """The first entry where two catalogs part, both sides (the lines that differ, when it
    is one object's), or '' when they agree."""
    import difflib

    matcher = difflib.SequenceMatcher(a=expected, b=actual, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        gone = expected[i1] if i1 < i2 else "(nothing)"
        came = actual[j1] if j1 < j2 else "(nothing)"
        if i1 < i2 and j1 < j2 and gone.split(None, 2)[:2] == came.split(None, 2)[:2]:
            return "\n".join(difflib.unified_diff(gone.splitlines(), came.splitlines(),
                                                   "expected", "found", n=2, lineterm=""))
        return f"expected:\n{gone}\n\nfound instead:\n{came}"
    return ""


def dump(url: str, schema: str = "jobfence") -> str:
    """Every table, constraint, index, trigger and function of ``schema``."""
    with psycopg.connect(url) as conn:
        return "\n".join(r[0] for r in conn.execute(CATALOG, {"schema": schema})) + "\n"


if __name__ == "__main__":
    sys.stdout.write(dump(sys.argv[1]))
