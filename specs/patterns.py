"""String patterns shared by the pydantic models, the msgspec mirror and error messages."""

# Decimal token id used as a mapping key (JSON object keys are strings).
TOKEN_KEY_PATTERN = r"^(0|[1-9][0-9]{0,9})$"
# Import string of a processor factory: ``package.module:Name``.
FACTORY_PATTERN = (
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
)

PATTERN_RULES = {
    TOKEN_KEY_PATTERN: 'must be a decimal token id such as "42"',
    FACTORY_PATTERN: "must be an import string 'package.module:Name'",
}
