#!/usr/bin/python3
"""Reference renderings of the real chat templates, made with Python Jinja2 the way transformers does.

Writes tests/chat/conversations.json (the conversations) and tests/chat/refs/<template>.json
(each conversation rendered by each template, or the error it raises). Run with Debian's
python3 (`apt-get install -y python3-jinja2`; `/usr/bin/python3 scripts/make_template_refs.py`)
after scripts/fetch_tokenizers.sh. The environment mirrors transformers' _compile_jinja_template:
ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols), a json.dumps tojson,
raise_exception and strftime_now globals; strftime_now reads a fixed date so outputs are stable.
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = ["qwen3", "llama3", "deepseek_v3", "gemma3"]
# The same fixed clock the C++ tests inject.
FIXED_NOW = datetime.datetime(2026, 11, 29, 14, 5, 9)


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def token_text(tok):
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def load_template(name):
    path = os.path.join(ROOT, "third_party", "npm", name, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    tmpl = config["chat_template"]
    if isinstance(tmpl, list):
        tmpl = {t["name"]: t["template"] for t in tmpl}["default"]
    return tmpl, token_text(config.get("bos_token")), token_text(config.get("eos_token"))


WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search",
    "description": "Search the web; returns \"snippets\" — at most `limit`",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
        "score": {"type": "number", "default": 0.5},
        "filters": {"type": "array", "items": {"type": "string"}},
        "safe": {"type": "boolean", "default": True},
        "extra": {"type": ["object", "null"], "default": None}},
        "required": ["query"]}}}


def call(name, args, call_id="call_1", as_string=False):
    return {"id": call_id, "type": "function", "function": {
        "name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


def sys_msg(text):
    return {"role": "system", "content": text}


def user(text):
    return {"role": "user", "content": text}


def asst(text, **kw):
    return {"role": "assistant", "content": text, **kw}


def tool(text, name="get_weather"):
    return {"role": "tool", "content": text, "name": name}


def conversations():
    c = []

    def add(name, messages, tools=None, add_generation_prompt=True, extra=None):
        c.append({"name": name, "messages": messages, "tools": tools,
                  "add_generation_prompt": add_generation_prompt, "extra": extra or {}})

    hi = [user("Hello! Who are you?")]
    add("user_only", hi)
    add("user_only_no_generation_prompt", hi, add_generation_prompt=False)
    add("system_user", [sys_msg("You are a terse assistant."), user("What is 2+2?")])
    add("system_user_assistant_no_gen",
        [sys_msg("You are a terse assistant."), user("What is 2+2?"), asst("4")],
        add_generation_prompt=False)
    multi = [user("Name a colour."), asst("Blue."), user("Another?"), asst("Green."), user("One more.")]
    add("multi_turn", multi)
    add("multi_turn_system_no_gen", [sys_msg("Answer in one word.")] + multi + [asst("Red.")],
        add_generation_prompt=False)
    add("enable_thinking_false", hi, extra={"enable_thinking": False})
    add("enable_thinking_true", hi, extra={"enable_thinking": True})
    add("enable_thinking_false_no_gen", hi, add_generation_prompt=False, extra={"enable_thinking": False})
    add("multi_turn_thinking_false", multi, extra={"enable_thinking": False})
    add("tools_user", [user("What's the weather in Paris?")], tools=[WEATHER])
    add("tools_system_user", [sys_msg("You help with travel."), user("Weather in Oslo and news?")],
        tools=[WEATHER, SEARCH])
    add("tool_call_dict_args", [
        user("What's the weather in Paris?"),
        asst("", tool_calls=[call("get_weather", {"city": "Paris", "unit": "celsius"})]),
        tool('{"temperature": 21.5, "sky": "clear"}'),
    ], tools=[WEATHER])
    add("tool_call_string_args", [
        user("What's the weather in Paris?"),
        asst(None, tool_calls=[call("get_weather", {"city": "Paris"}, as_string=True)]),
        tool('{"temperature": 21.5}'),
    ], tools=[WEATHER])
    add("tool_call_string_args_empty_content", [
        user("What's the weather in Lima?"),
        asst("", tool_calls=[call("get_weather", {"city": "Lima", "unit": "celsius"}, as_string=True)]),
        tool('{"temperature": 19}'),
    ], tools=[WEATHER], extra={"enable_thinking": False})
    add("parallel_tool_calls_string_args_empty_content", [
        sys_msg("Be quick."),
        user("Weather in Quito and Bogotá?"),
        asst("", tool_calls=[call("get_weather", {"city": "Quito"}, "a", True),
                             call("get_weather", {"city": "Bogotá"}, "b", True)]),
        tool("Quito: 15"), tool("Bogotá: 14"),
        asst("Quito 15, Bogotá 14."),
    ], tools=[WEATHER], add_generation_prompt=False)
    add("tool_call_string_args_answered", [
        sys_msg("Use tools when helpful."),
        user("Weather in Rome?"),
        asst(None, tool_calls=[call("get_weather", {"city": "Rome"}, as_string=True)]),
        tool("sunny, 30 °C"),
        asst("It is sunny and 30 °C in Rome."),
        user("Thanks!"),
    ], tools=[WEATHER], add_generation_prompt=False)
    add("parallel_tool_calls_string_args", [
        user("Weather in Paris and in Berlin?"),
        asst(None, tool_calls=[call("get_weather", {"city": "Paris"}, "call_1", True),
                               call("get_weather", {"city": "Berlin"}, "call_2", True)]),
        tool("Paris: 18"), tool("Berlin: 12"),
    ], tools=[WEATHER])
    add("parallel_tool_calls_dict_args", [
        user("Weather in Paris and in Berlin?"),
        asst("Let me check both.", tool_calls=[call("get_weather", {"city": "Paris"}, "call_1"),
                                               call("get_weather", {"city": "Berlin"}, "call_2")]),
        tool("Paris: 18"), tool("Berlin: 12"),
    ], tools=[WEATHER])
    add("tool_call_numbers_in_args", [
        user("Search for pi."),
        asst("", tool_calls=[call("search", {"query": "π digits", "limit": 10, "score": 1.0,
                                             "threshold": 1e-07, "big": 12345678901234,
                                             "ratio": 0.1, "neg": -2.5, "safe": False,
                                             "extra": None, "filters": ["a", "b"],
                                             "nested": {"x": [1, {"y": "z"}], "empty": {}}})]),
        tool("3.14159"),
        asst("Pi starts 3.14159."),
    ], tools=[SEARCH], add_generation_prompt=False)
    add("reasoning_content", [
        user("Is 17 prime?"),
        asst("Yes, 17 is prime.", reasoning_content="Check divisors 2, 3: none divide 17."),
        user("And 21?"),
    ])
    add("reasoning_content_last_no_gen", [
        user("Is 17 prime?"),
        asst("Yes, 17 is prime.", reasoning_content="\nCheck divisors 2, 3.\n"),
    ], add_generation_prompt=False)
    add("reasoning_content_none_with_think", [
        user("Is 9 prime?"),
        asst("<think>\n9 = 3 * 3\n</think>\n\nNo.", reasoning_content=None),
    ], add_generation_prompt=False)
    add("think_in_content_last", [
        user("Is 17 prime?"),
        asst("<think>\nTry 2, 3, 4.\n</think>\n\nYes."),
    ], add_generation_prompt=False)
    add("think_in_content_earlier", [
        user("Is 17 prime?"),
        asst("<think>\nTry 2, 3, 4.\n</think>\n\nYes."),
        user("Is 18 prime?"),
    ], extra={"enable_thinking": True})
    add("unicode_emoji", [
        sys_msg("Réponds en français 🇫🇷."),
        user("Ça va? 😀 日本語 — naïve café ∑ \u00a0nbsp"),
        asst("Très bien 👍"),
        user("Ünïcödé ✓"),
    ])
    add("empty_content", [user(""), asst(""), user("")])
    add("whitespace_content", [user("  padded  \n"), asst("\n\nanswer\t \n"), user("\tq ")],
        add_generation_prompt=False)
    add("special_characters", [
        user("Quotes ' \" and backslash \\ and braces {{ x }} {% if %} {# c #}"),
        asst('{"json": [1, 2], "path": "C:\\\\tmp"}'),
        user("<|im_start|> tokens <|eot_id|> in text"),
    ])
    add("non_alternating_users", [user("first"), user("second")])
    add("assistant_first", [asst("I speak first."), user("ok")])
    add("system_only", [sys_msg("You are helpful.")])
    add("two_system_messages", [sys_msg("Rule one."), sys_msg("Rule two."), user("Go.")])
    add("long_tool_loop", [
        sys_msg("You are an agent."),
        user("Plan a trip to Oslo."),
        asst(None, tool_calls=[call("get_weather", {"city": "Oslo"}, as_string=True)]),
        tool("rain"),
        asst("It will rain in Oslo."),
        user("And Bergen and Tromsø?"),
        asst(None, tool_calls=[call("get_weather", {"city": "Bergen"}, "c2", True),
                               call("get_weather", {"city": "Tromsø"}, "c3", True)]),
        tool("rain"), tool("snow"),
        asst("Bergen: rain. Tromsø: snow."),
        user("Thanks."),
    ], tools=[WEATHER, SEARCH])
    add("user_tool_response_wrapped", [
        user("Start."),
        asst("", tool_calls=[call("search", {"query": "x"})]),
        user("<tool_response>\nresult\n</tool_response>"),
    ], tools=[SEARCH], extra={"enable_thinking": False})
    add("tools_enable_thinking_true", [user("Search for cats.")], tools=[SEARCH],
        extra={"enable_thinking": True})
    add("content_parts_list", [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": " Describe "}, {"type": "image"},
                                     {"type": "text", "text": "this."}]},
    ])
    add("tool_first_message", [tool("orphan result"), user("What was that?")])
    add("extra_kwargs_unused", hi, extra={"enable_thinking": True, "custom_flag": "x", "n": 3})
    return c


def main():
    convs = conversations()
    with open(os.path.join(ROOT, "tests", "chat", "conversations.json"), "w", encoding="utf-8") as f:
        json.dump(convs, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for name in TEMPLATES:
        source, bos, eos = load_template(name)
        tmpl = compile_template(source)
        cases = []
        ok = 0
        for conv in convs:
            case = {"conversation": conv["name"]}
            try:
                # transformers passes only the special tokens that are set.
                tokens = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
                case["output"] = tmpl.render(
                    messages=conv["messages"], tools=conv["tools"], documents=None,
                    add_generation_prompt=conv["add_generation_prompt"], **tokens, **conv["extra"])
                ok += 1
            except jinja2.exceptions.TemplateError as e:
                # raise_exception; UndefinedError is also a TemplateError subclass.
                case["error"] = str(e)
                case["error_type"] = type(e).__name__
            except Exception as e:
                case["error"] = str(e)
                case["error_type"] = type(e).__name__
            cases.append(case)
        out = {"template": name, "jinja2": jinja2.__version__, "bos_token": bos, "eos_token": eos,
               "cases": cases}
        with open(os.path.join(ROOT, "tests", "chat", "refs", name + ".json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{name}: {ok} rendered, {len(cases) - ok} raise")


if __name__ == "__main__":
    sys.exit(main())
