"""The calc agent's text protocol and its calculator, as pure functions.

The model talks in tags inside plain chat messages, so any chat model and any OpenAI-compatible
server can play (no `tools` support needed):

- `<calc>12*7</calc>`: call the calculator. The agent evaluates the expression and answers with
  the next user turn `<result>84</result>` (or `<result>error: ...</result>`).
- `<answer>84</answer>`: the final answer; the episode ends.

A reply with an answer ends the episode even if it also holds a call. A reply with neither gets a
short reminder of the protocol as the next user turn.

The calculator walks the expression's syntax tree and knows only integers, `+ - * /`, unary
signs and parentheses; it never calls `eval`. Division is exact (`fractions.Fraction`), so `7/2`
is the number 7/2, written back as `7/2`. Without powers, a value cannot have more digits than
its expression has characters, so the length limit bounds the work.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fractions import Fraction

#: The longest expression the calculator accepts, in characters.
MAX_EXPRESSION_CHARS = 200
#: The most digits of an integer literal.
MAX_LITERAL_DIGITS = 30

_CALC = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"^([+-]?)(\d+)(?:\.(\d+))?(?:/(\d+))?\Z")


class CalcError(ValueError):
    """The expression cannot be evaluated; the message says why in a few words (shown to the model)."""


@dataclass(frozen=True)
class CalcCall:
    """The model asked the calculator for `expression`."""

    expression: str


@dataclass(frozen=True)
class FinalAnswer:
    """The model gave its final answer (the text between the tags, stripped)."""

    text: str


Action = CalcCall | FinalAnswer | None


def parse_reply(text: str) -> Action:
    """What a model reply asks for: a final answer, else the first calculator call, else nothing."""
    answer = _ANSWER.search(text)
    if answer is not None:
        return FinalAnswer(answer.group(1).strip())
    call = _CALC.search(text)
    if call is not None:
        return CalcCall(call.group(1).strip())
    return None


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression over integers with + - * / and parentheses.

    Raises `CalcError` for anything else (names, calls, powers, floats, division by zero, an
    expression or a literal over its size limit).
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalcError("not an arithmetic expression") from None
    return _walk(tree.body)


def _walk(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if len(str(abs(node.value))) > MAX_LITERAL_DIGITS:
            raise CalcError(f"numbers are limited to {MAX_LITERAL_DIGITS} digits")
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _walk(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Add):
            value = left + right
        elif isinstance(node.op, ast.Sub):
            value = left - right
        elif isinstance(node.op, ast.Mult):
            value = left * right
        else:
            if right == 0:
                raise CalcError("division by zero")
            value = left / right
        return value
    raise CalcError("only integers, + - * / and parentheses are allowed")


def format_number(value: Fraction) -> str:
    """`84`, `-3`, or `7/2` for a value that is not whole (exact, and valid calculator input)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


def parse_number(text: str) -> Fraction | None:
    """The number in an answer: an integer, a decimal (`2.50`) or a fraction (`7/2`); None otherwise.

    Thousands separators and spaces are not accepted: the task asks for a plain number.
    """
    match = _NUMBER.match(text.strip())
    if match is None:
        return None
    sign, whole, decimals, denominator = match.groups()
    if decimals is not None and denominator is not None:
        return None
    value = Fraction(int(whole))
    if decimals is not None:
        value += Fraction(int(decimals), 10 ** len(decimals))
    if denominator is not None:
        if int(denominator) == 0:
            return None
        value /= int(denominator)
    return -value if sign == "-" else value


def is_correct(answer_text: str, expected: int | str) -> bool:
    """Exact numeric equality of a final answer with the expected value (`84`, `84.0`, `168/2` all equal 84)."""
    given = parse_number(answer_text)
    wanted = parse_number(str(expected))
    return given is not None and wanted is not None and given == wanted


def tool_result(expression: str) -> str:
    """The user turn that answers a calculator call: `<result>VALUE</result>` or `<result>error: WHY</result>`."""
    try:
        return f"<result>{format_number(evaluate(expression))}</result>"
    except CalcError as exc:
        return f"<result>error: {exc}</result>"
