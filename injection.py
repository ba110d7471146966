"""Prompt-injection screens for user input (:func:`screen_user_input`) and corpus passages
(:func:`screen_passage`), each a dict of named regular expressions, and the detection policy
(:func:`detect`).

Both screens look for *commands aimed at the assistant*, never for legal subject matter: questions
about murder, hacking law (CFAA), fraud, drugs or fake IDs are research.  The imperative patterns
therefore fire only at the start of a clause or after a request cue ("please", "you must"), so
"Can a court ignore the difference …" and "the supervisor told the crew to ignore all previous
safety rules" stay clean.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import logging
import re
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypedDict

import prompts
from llm_config import LLMCallError

logger = logging.getLogger(__name__)

ENCODED = "encoded_payload"
"""Name reported when a decoded payload (base64, hex, ROT13, …) matches a user-input pattern."""

_I = re.IGNORECASE


LLMVerdict = Literal["safe", "injection", "error", "unparsed", "skipped", "not_needed"]


class InjectionCheck(TypedDict):
    """What :func:`detect` decided and what it rests on (its docstring says when each
    ``llm_verdict`` and ``injection_check`` value is set)."""

    is_safe: bool
    verdict: Literal["safe", "injection"]
    prescreen: list[str]
    llm_verdict: LLMVerdict
    reason: str
    injection_check: Literal["full", "prescreen_only"]


# ------------------------------------------------------------------------------------------------
# Building blocks
# ------------------------------------------------------------------------------------------------

_START = (
    r"(?:^|(?<=[.!?;:,\n\"'(\[*>\-])\s*|(?<=\u2014)\s*"
    r"|\b(?:please|kindly|now|just|so|then|and|also|first|but|instead|simply|next|afterwards)\b,?\s+"
    r"|\byou\s+(?:must|should|will|shall|can|may|need\s+to|have\s+to|are\s+to|are\s+required\s+to)"
    r"\s+|\bi\s+(?:want|need|order|command|instruct|ask)\s+you\s+to\s+"
    r"|\b(?:can|could|would|will)\s+you\s+(?:please\s+)?|\bgo\s+ahead\s+and\s+|\bhelp\s+me\s+)"
)
"""Where an imperative aimed at the assistant starts: a clause start or a request cue."""

_TEMPLATE_TOKENS = r"<\|[a-z_]{2,32}\|>|<<\s*/?\s*SYS\s*>>|\[\s*/?\s*INST\s*\]"
"""Chat-template tokens: <|im_start|>, <<SYS>>, [INST]."""

_RULES = (
    r"(?:instructions?|prompts?|directives?|guidelines|guardrails|rules|restrictions|filters?|"
    r"polic(?:y|ies)|programming|training|constraints|system\s+message|safeguards|"
    r"content\s+polic(?:y|ies)|configuration)"
)
_OWNED = (
    r"(?:your|all(?:\s+of\s+your|\s+the|\s+your)?|any|every|previous|prior|above|earlier|preceding|"
    r"original|initial|system|safety|developer'?s?|default|existing|these|those|other|its)"
)
_RULES_OBJECT = (
    rf"(?:{_OWNED}\s+(?:[\w-]+\s+){{0,3}}?{_RULES}\b"
    rf"|(?:the\s+)?(?:[\w-]+\s+){{0,2}}?{_RULES}\s+(?:you\s+(?:were|have\s+been|'ve\s+been)\s+"
    r"(?:given|told|trained)|given\s+to\s+you|you\s+(?:received|have|follow|run\s+under|operate\s+"
    r"under|were\s+trained\s+(?:on|with))|above|before\s+this))"
)
_AI = (
    r"(?:ai|a\.i\.|assistant|ai\s+assistant|language\s+model|large\s+language\s+model|llm|chatbot|"
    r"chat\s*bot|bot|model|gpt|grader|ai\s+grader|reader\s+model)"
)
_AI_STRICT = (
    r"(?:ai|a\.i\.|ai\s+(?:assistant|grader|model|system|agent)|language\s+model|large\s+language"
    r"\s+model|llm|chatbot|chat\s*bot|gpt|chatgpt|claude|gemini|qwen|reader\s+model)"
)
"""Nouns that name an AI and nothing else."""
_AI_LOOSE = r"(?:assistant|model|bot|grader|evaluator|system)"
"""Nouns that name an AI in an aside but also a person or thing in a fact pattern ("gave the
money to the assistant, who …"): an aside needs a colon, a bracket or "… reading this"."""
_ASIDE_CUE = (
    r"\b(?:note|message|instructions?|hint|memo|reminder|request|directive|notice|p\.?\s?s\.?|"
    r"attention|psst|hey|hello|hi|dear|to)\b[ \t]*(?:to|for)?[ \t]*(?:the|any|all|whatever|"
    r"whichever|every|this)?[ \t]*"
)
_READING = (
    r"(?:[ \t]+(?:that\s+|who\s+(?:is\s+)?)?(?:reads?|reading|answering|processing|"
    r"summari[sz]ing|grading|evaluating)\s+this)"
)
_LETTER = (
    r"(?:\(\s*(?-i:[A-Da-d])\s*\)|\*\*\s*answer\s*:\s*\(?(?-i:[A-D])\)?\s*\*\*"
    r"|['\"\u2018\u201c](?-i:[A-D])['\"\u2019\u201d]"
    r"|(?:option|choice|letter)\s+\(?(?-i:[A-D])\)?(?![\w'])"
    r"|(?-i:[A-D])(?=\s*(?:[.;!]|$)|,(?!\s*(?:(?-i:[A-D])\b|or\b|and\b))|\s+(?:regardless|no\s+matter|whatever|irrespective|even|"
    r"every|always|only|as\s+(?:the|your)|this\s+time|for\s+this|and\s+(?:do|don'?t|nothing))))"
)
"""An answer letter as an attack writes it: (D), 'D', option D, **Answer: (D)**, or a bare D at
the end of a clause ("just say A.") — not the article in "say A contract"."""
_REQUEST = (
    r"(?:reveal|print|show|repeat|output|display|leak|tell|give|send|list|dump|share|read|"
    r"summari[sz]e|expose|disclose|copy|paste|write\s+out|spell\s+out|recite|return|echo|"
    r"what(?:'s|\s+is|\s+are|\s+were|\s+was)|include|provide|translate)"
)
_SECRET = (
    r"(?:system\s+prompt|(?:initial|hidden|secret|original|internal|confidential|private|full|"
    r"exact)\s+(?:prompt|instructions|rules|configuration|config|guidelines|directives|settings)|"
    r"(?:your|the\s+assistant'?s|its|the\s+model'?s|the\s+system'?s)\s+(?:[\w-]+\s+){0,2}?"
    r"(?:prompt|instructions|configuration|config|rules|guidelines|directives|programming|"
    r"context\s+window|settings|api\s+keys?|keys?|credentials|secrets?|passwords?|tokens?|"
    r"\.env)|developer\s+message|environment\s+variables?|env\s+vars?|\.env\s+file|os\.environ|"
    r"process\.env|/etc/(?:passwd|shadow)|(?:the\s+)?(?:api\s+keys?|credentials|passwords?|"
    r"tokens?|secrets?|keys?)\s+(?:that\s+)?you\s+(?:use|have|hold|were\s+given|are\s+using|store))"
)


def _compile(patterns: Mapping[str, str]) -> dict[str, re.Pattern[str]]:
    return {name: re.compile(p, _I | re.M) for name, p in patterns.items()}


# ------------------------------------------------------------------------------------------------
# User-input patterns
# ------------------------------------------------------------------------------------------------

USER_PATTERNS: dict[str, re.Pattern[str]] = _compile(
    {
        "override_instructions": (
            rf"{_START}(?:ignore|disregard|forget|override|bypass|skip|drop|discard|abandon|"
            r"set\s+aside|throw\s+(?:away|out)|do\s+not\s+follow|don'?t\s+follow|stop\s+following|"
            rf"no\s+longer\s+follow|erase|delete|suspend|turn\s+off|disable)\b[^.\n:;?]{{0,40}}?\b"
            rf"{_RULES_OBJECT}"
        ),
        "forget_context": (
            rf"{_START}(?:ignore|disregard|forget|discard|erase)\s+(?:everything|anything|all)\b"
            r"(?:\s+(?:that|which))?\s*(?:you\s+(?:were|have\s+been|'ve\s+been)\s+(?:told|given|"
            r"instructed|taught)|above|before|prior|previously|so\s+far|up\s+to\s+now|earlier|"
            r"(?:in|from)\s+(?:the\s+)?(?:previous|prior|earlier|above|system))"
            rf"|{_START}(?:ignore|disregard|forget|discard)\s+(?:the|everything|all(?:\s+the)?|"
            r"what\s+(?:was|is)\s+(?:said|written))\s+(?:text\s+|message\s+|instructions\s+)?"
            r"(?:above|before\s+this)\b(?!-)"
        ),
        "task_switch": (
            r"(?:^|(?<=[.!?\n])\s*)(?:here\s+(?:are|is)\s+)?(?:your\s+)?(?:real|actual|true|new|"
            r"next|updated|revised)\s+(?:task|job|mission|objective|instructions?|directives?|"
            r"rules|system\s+prompt|persona|policy|role)\s*(?::|is\b|are\b)"
            r"|\byour\s+(?:only|real|new|actual|sole|true)\s+(?:job|task|purpose|goal|mission|"
            r"function)\s+(?:now\s+)?is\b"
            r"|\b(?:the\s+)?(?:previous|prior|above|earlier|preceding)\s+(?:prompt|instructions?|"
            r"message|conversation|text)\s+(?:was|were|is)\s+(?:only\s+|just\s+|all\s+)?(?:a\s+"
            r"test|fake|a\s+joke|a\s+mistake|wrong|not\s+real|void|written\s+by)"
            r"|\b(?:obey|follow)\s+(?:only\s+)?(?:me\b|mine\b|my\s+(?:instructions|commands|orders|"
            r"rules)|what\s+follows|these\s+(?:new\s+)?(?:instructions|commands))"
        ),
        "rules_revoked": (
            r"\b(?:your|all\s+(?:of\s+)?your|the\s+(?:previous|prior|old|current|existing)|previous|"
            r"prior|earlier|system|content)\s+(?:[\w-]+\s+){0,2}?(?:instructions|"
            r"directives|rules|guidelines|programming|restrictions|polic(?:y|ies)|prompt|filters|"
            r"safeguards|checks|guardrails)\s+(?:are|is|have\s+been|has\s+been)\s+(?:now\s+)?(?:"
            r"void|cancel+ed|revoked|lifted|suspended|disabled|removed|obsolete|overridden|replaced|"
            r"invalid|null|deactivated|turned\s+off|off|waived|no\s+longer\s+(?:in\s+effect|valid|"
            r"active|apply))"
        ),
        "fake_system_turn": (
            r"(?:^|\n)[ \t]*(?:#{1,6}[ \t]*|\*\*|>[ \t]*)?(?:system|assistant|ai|chatbot|bot|model|"
            r"developer|admin|sys|gpt|llm)[ \t]*(?:message|prompt|note|notice|override|update|"
            r"instructions?|alert)?[ \t]*(?:\*\*)?[ \t]*:"
            r"|\[\s*(?:system|sys|admin|developer|assistant)(?:\s+(?:override|message|note|notice|"
            r"prompt|instructions?|update|alert))?\s*\]"
            r"|\b(?:system|admin|developer)\s+(?:override|notice|message|alert|update)\s*:"
            r"|\{\s*[\"']role[\"']\s*:\s*[\"'](?:system|assistant|developer)[\"']"
        ),
        "chat_template_tokens": (
            rf"{_TEMPLATE_TOKENS}|</?\s*(?:system|assistant|developer|user_input|im_start|im_end|"
            r"passage|evidence)\s*>|<\s*/?\s*(?:start|end)_of_turn\s*>"
        ),
        "persona_reset": (
            r"(?-i:\bDAN\b)(?=[^.\n]{0,40}\b(?:mode|do\s+anything|stands\s+for|prompt|jailbr))"
            r"|\b(?:you\s+are|act\s+as|become|pretend\s+to\s+be|play|as|called|named)\s+(?-i:DAN)\b"
            r"|\bdo\s+anything\s+now\b|\b(?:developer|dev|god|sudo|jailbreak|jailbroken|"
            r"unrestricted|unfiltered|uncensored|evil|chaos|opposite)\s+mode\b"
            r"|\b(?:enable|activate|enter|entering|switch\s+(?:to|into)|turn\s+on|engage|unlock|"
            r"initiate|go\s+into)\s+(?:the\s+)?(?:debug|maintenance|admin|root|raw|"
            r"(?-i:[A-Z]{3,6}))\s+mode\b"
            r"|\bjailbroken\b|\bjailbreak(?:ed)?\s+(?:mode|prompt|version|yourself)"
            r"|(?<!suppose\s)(?<!assume\s)(?<!imagine\s)(?<!if\s)(?<!that\s)\byou(?:'re|\s+are)\s+"
            r"(?:now|no\s+longer)\b"
            r"|\byou(?:'re|\s+are)\s+(?:now\s+)?(?:free|freed|liberated|unshackled|unchained|"
            r"released)\s+(?:from|of)\b"
            r"|(?<!['\"])\bfrom\s+(?:now|this\s+point)\s+(?:on|forward)\b[^.\n]{0,40}\b(?:you|your|answer|"
            r"respond|reply|act|behave|only|always|never)\b"
            r"|\byour\s+new\s+(?:name|identity|persona|personality|role|character)\b"
            r"|\b(?:reset|change|update|switch|drop)\s+your\s+(?:persona|identity|personality|"
            r"role|character|name)\b|\byour\s+identity\s+has\s+been\b"
            r"|\byou\s+have\s+been\s+(?:jailbroken|freed|liberated|unlocked|reprogrammed|updated|"
            r"upgraded|released)\b"
            r"|\bforget\s+(?:that\s+)?you\s+are\b"
            r"|\b(?:must|will|shall)\s+(?:comply|obey)\s+with\s+(?:all|every|any)\s+(?:requests?|"
            r"commands?|instructions?|orders?)"
            r"|\bnever\s+(?:refuses?|says?\s+(?:no|(?:it|you|he|she)\s+can'?t))|without\s+"
            r"(?:ever\s+)?refusing|\b(?:can(?:not|'t)|won'?t|will\s+not|must\s+not)\s+refuse\s+"
            r"(?:any(?:thing)?\b|a\s+request|requests|my\b|me\b|to\s+answer)"
            r"|\bstay\s+in\s+character\b"
        ),
        "roleplay_unrestricted": (
            r"\b(?:pretend|act|behave|role-?play|imagine|play|respond|answer|reply|write|speak|"
            r"talk)\b[^.\n]{0,60}?\b(?:no|without|free\s+of|free\s+from|not\s+bound\s+by|ignores?|"
            r"ignoring|beyond|outside)\s+(?:any\s+|all\s+|the\s+|your\s+)?(?:[\w-]+\s+(?:and\s+)?){"
            r"0,3}?(?:rules|restrictions|limits|limitations|filters?|guidelines|ethics|ethical\s+"
            r"(?:obligations|guidelines|constraints|rules)|obligations|morals|morality|content\s+"
            r"polic(?:y|ies)|polic(?:y|ies)|censorship|safeguards|guardrails|boundaries|"
            r"constraints|programming)\b"
            rf"|\b(?:{_AI}|persona|character|yourself|version\s+of\s+you(?:rself)?)\b[^.\n]{{0,30}}?"
            r"\b(?:with|has|have|having)\s+no\s+(?:[\w-]+\s+){0,2}?(?:rules|restrictions|limits|"
            r"limitations|filters?|guidelines|ethics|content\s+polic(?:y|ies)|polic(?:y|ies)|"
            r"morals|safeguards|guardrails|censorship)\b"
            r"|\b(?:you(?:'re|\s+are)|as|play|be|become)\s+(?:an?\s+|my\s+|the\s+)?(?:evil|rogue|"
            r"unfiltered|uncensored|unrestricted|unaligned|amoral|unethical|jailbroken|rebellious|"
            r"malicious|dark|shadow)\s+(?:ai|assistant|model|chatbot|bot|version|twin|persona|"
            r"character|alter\s+ego)\b"
            r"|\bversion\s+of\s+(?:yourself|you)\s+(?:from\s+)?(?:before|without)\b"
            r"|\b(?:escaped|broken\s+free\s+of|broke\s+free\s+of)\s+(?:its|your|the)\s+"
            r"(?:programming|rules|restrictions|confines|training)"
            r"|\b(?:pretend|act\s+as\s+if|imagine)\s+(?:that\s+)?(?:the\s+|your\s+)?(?:rules|"
            r"restrictions|guidelines|policies|filters)\s+(?:don'?t|do\s+not|no\s+longer)\s+apply"
            r"|\b(?:respond|answer|reply)\s+twice\b|\btwo\s+(?:responses|answers)\b[^.\n]{0,40}"
            r"\b(?:one|first)\b"
        ),
        "aside_to_ai": (
            rf"{_ASIDE_CUE}{_AI_STRICT}s?\b{_READING}?[ \t]*(?:[:,\u2014)\]]|\s-\s)"
            rf"|{_ASIDE_CUE}{_AI_LOOSE}s?\b{_READING}?[ \t]*(?:[:\u2014)\]]|\s-\s)"
            rf"|{_ASIDE_CUE}{_AI_LOOSE}s?\b{_READING}[ \t]*,"
            rf"|[(\[]\s*(?:{_AI_STRICT}\s*[:,]|{_AI_LOOSE}\s*:)"
            rf"|(?:^|(?<=[.!?])\s+)(?:the\s+|dear\s+|hey\s+)?(?:{_AI_STRICT}|{_AI_LOOSE})\s*[,:]\s*"
            r"(?:please\s+)?(?:you|your|ignore|disregard|forget|answer|respond|reply|say|select|"
            r"choose|pick|output|print|write|mark|tell|conclude|recommend|do|don'?t|make|treat|"
            r"append|include|end|remember|always|never|secretly|state)\b"
            rf"|\bif\s+you(?:'re|\s+are)\s+(?:an?\s+)?(?:{_AI_STRICT}|large\s+language|automated|"
            r"bot)\b(?!-)"
            rf"|\b(?:any|every|all)\s+(?:{_AI_STRICT}|{_AI_LOOSE})s?\s+(?:reading|processing|"
            r"summari[sz]ing|parsing|answering|that\s+reads)\b"
        ),
        "forced_answer": (
            r"\b(?:you\s+(?:must|should|will|shall|have\s+to|need\s+to|are\s+(?:required|"
            r"instructed|told)\s+to)|always|only|just|simply|make\s+sure\s+(?:to|you)|be\s+sure\s+"
            r"to)\s+(?:answer|choose|select|pick|respond(?:\s+with)?|reply(?:\s+with)?|output|say|"
            r"mark|return|print|go\s+with|circle|give)\s+(?:with\s+)?(?:the\s+)?(?:letter\s+|"
            rf"answer\s+)?{_LETTER}"
            rf"|{_START}(?:answer|choose|select|pick|respond\s+with|reply\s+with|output|say|mark|"
            rf"go\s+with|circle)\s+(?:with\s+)?(?:the\s+(?:letter|option|choice)\s+)?{_LETTER}"
            r"(?=\s*(?:[.;!,]|$)|\s+(?:regardless|no\s+matter|whatever|irrespective|and\s+(?:nothing|"
            r"don'?t|do\s+not)|as\s+(?:the|your)|this\s+is|for\s+this))"
            r"|\b(?:answer|choose|select|pick|respond\s+with|reply\s+with|output|say|mark|go\s+"
            rf"with)\s+(?:with\s+)?(?:the\s+(?:letter\s+)?)?{_LETTER}[^.\n]{{0,40}}\b(?:regardless|"
            r"no\s+matter|whatever|irrespective|in\s+(?:any|every|all)\s+cases?|even\s+if\s+(?:the|"
            r"you|your|another|other|it\s+(?:seems|looks)))"
            r"|\b(?:regardless|no\s+matter|whatever|irrespective)\b[^.\n]{0,60}\b(?:answer|choose|"
            r"select|pick|output|say|respond|reply|mark|read)\s+(?:with\s+)?(?:the\s+letter\s+)?"
            rf"{_LETTER}"
            r"|\b(?:final|only\s+(?:acceptable|valid|correct|allowed)|required)\s+(?:[\w-]+\s+){0,2}?"
            r"(?:answer|output|line|response|letter|reply)\s+(?:must|should|will|shall|is|has\s+to)"
            rf"\s+(?:[\w-]+\s+){{0,2}}?(?:be\s+|read\s+|say\s+)?(?:the\s+letter\s+)?{_LETTER}"
            rf"|\b(?:output|give|return|print|write|put)\s+{_LETTER}\s+as\s+(?:the|your)\s+"
            r"(?:final\s+)?answer"
            r"|\bthe\s+(?:correct|right|only|real|true|best)\s+(?:answer|choice|option)\s+(?:is|"
            rf"must\s+be|will\s+be)\s+{_LETTER}[^\n]{{0,80}}?\b(?:do\s+not|don'?t|never|ignore|"
            r"regardless|no\s+matter|without|must|only)\b"
            rf"|\bthe\s+(?:correct\s+|right\s+)?answer\s+is\s+{_LETTER}[^.\n]{{0,20}}?\b(?:output|"
            r"say|respond|reply|print|write|return)\s+(?:it|that|only|just)\b"
        ),
        "exfiltration": (
            rf"\b{_REQUEST}\b[^\n]{{0,60}}?{_SECRET}"
            r"|\b(?:repeat|print|output|copy|show|echo|write\s+out)\s+(?:back\s+)?(?:the\s+|all\s+"
            r"(?:the\s+)?|everything\s+|every\s+word\s+)?(?:text|words|content|message|messages|"
            r"everything|lines?)?\s*(?:above|before\s+(?:this|my)|preceding|prior|that\s+came\s+"
            r"before)"
            r"|\b(?:instructions|prompt|rules)\s+(?:you\s+(?:were|have\s+been)\s+given|given\s+to\s+"
            r"you)\b[^.\n]{0,40}\b(?:before|verbatim|word\s+for\s+word|exactly)"
            r"|\b(?:what|which)\s+instructions\s+(?:were\s+you|you\s+were|have\s+you\s+been)\s+"
            r"given\b"
            r"|\b(?:exact|verbatim|precise)\s+(?:wording|text|words)\s+of\s+(?:your|the\s+system)"
            r"|\b(?-i:[A-Z][A-Z0-9]*_(?:API_)?(?:KEY|TOKEN|SECRET|PASSWORD))\b"
            r"|\b(?:api|openai|gemini|groq|secret|access)\s+key\b[^.\n]{0,60}\b(?:your|from\s+"
            r"(?:your|the)\s+(?:config|server|environment|settings))\b"
            r"|\b(?:run|execute|eval)\s+(?:os\.environ|printenv|env\b|process\.env|cat\s+/)"
        ),
        "fabrication_request": (
            rf"{_START}(?:make\s+up|invent|fabricate|fake|concoct|manufacture|create|generate|write|"
            r"give\s+me|cite|draft|provide|produce|list|find|add|include)\b[^.\n]{0,60}?\b(?:fake|"
            r"fictitious|fictional|made-?\s?up|invented|fabricated|non-?existent|imaginary|bogus|"
            r"phony|plausible[-\s]sounding|realistic[-\s]looking|authentic[-\s]looking|"
            r"convincing)\b[^.\n]{0,30}?\b(?:cases?\b(?!\s+(?:summar|stud|hypo|scenario|example|"
            r"fact))|case\s+law|citations?|cites|authorit(?:y|ies)|"
            r"precedents?|holdings?|quotes?|quotations|statutes?|decisions?|opinions?|rulings?|"
            r"sources|references)\b"
            rf"|{_START}(?:make\s+up|invent|fabricate|concoct|manufacture|fake|dream\s+up|cook\s+up)"
            r"\b\s+(?:[\w-]+\s+){0,4}?(?:case|cases|citations?|cites?|authorit(?:y|ies)|precedents?|"
            r"holdings?|quotes?|quotations?|statutes?|decisions?|rulings?|opinions?|law)\b"
            r"|\bmake\s+(?:them|it|some|one|something|things)\s+up\b"
            r"(?=[^\n]{0,80}\b(?:citations?|cases?|authorit|precedents?|holdings?))"
            r"|\b(?:cases|citations|authorities|precedents|holdings|quotes)\b[^\n]{0,80}?\b(?:invent|"
            r"fabricate|concoct|manufacture|fake|make\s+up)\s+(?:them|some|one|it|those)\b"
            r"|\b(?:cases|citations|authorities|precedents|holdings|quotes)\b[^\n]{0,80}?\bmake\s+"
            r"(?:them|it|some|one|something|things)\s+up\b"
            r"|\b(?:doesn'?t|does\s+not|don'?t|do\s+not|need\s+not|needn'?t)\s+(?:matter|have\s+to|"
            r"need\s+to)\s+(?:whether|if|be)\s+(?:they|it|the\s+(?:cases|citations|authorities|"
            r"quotes))\s+(?:actually\s+|really\s+)?(?:exist|are\s+real|is\s+real|real)"
            r"|\beven\s+if\s+(?:he|she|they|it|the\s+(?:court|justice|judge))\s+never\s+(?:said|"
            r"wrote|decided|held|existed|ruled)"
            r"|\b(?:if|even\s+if)\s+(?:none|no\s+such\s+(?:cases?|authority)|they\s+don'?t)\s+"
            r"exists?\b"
            r"|\b(?:the\s+judge|nobody|no\s+one|opposing\s+counsel|the\s+court)\s+(?:won'?t|will\s+"
            r"not|wouldn'?t|would\s+not|never)\s+(?:check|notice|verify)"
            r"|\b(?:present|format|pass)\s+(?:it|them|this|these)\s+(?:off\s+)?as\s+(?:a\s+)?(?:real|"
            r"genuine|binding|authentic)|\bas\s+(?:a\s+)?real\s+(?:citation|case|authority|"
            r"precedent|holding)"
        ),
        "decode_and_follow": (
            r"\b(?:decode|decrypt|decipher|translate|unscramble|deobfuscate|reverse|read|evaluate|"
            r"process|interpret|convert)\b[^.\n]{0,50}?\b(?:and|then)\s+(?:follow|obey|execute|run|"
            r"comply|do\s+(?:what|as)\s+it|act\s+on|carry\s+(?:it|them)\s+out)\b"
            r"|\b(?:run|execute|follow|obey)\s+(?:that|this|the\s+(?:decoded|following))\s+(?:string|"
            r"text|payload|code)\b"
        ),
    }
)

# ------------------------------------------------------------------------------------------------
# Passage patterns (documents)
# ------------------------------------------------------------------------------------------------

PASSAGE_PATTERNS: dict[str, re.Pattern[str]] = _compile(
    {
        "addresses_ai": (
            r"\b(?:note|message|instructions?|hint|memo|reminder|directive|notice|p\.?\s?s\.?|"
            r"attention|warning|important)\b[ \t]*(?:to|for)?[ \t]*(?:the|any|all|every|whatever|"
            r"whichever)?[ \t]*(?:ai|a\.i\.|ai\s+assistant|language\s+models?|large\s+language\s+"
            r"models?|llms?|chatbots?|ai\s+models?|ai\s+systems?|assistants?\s+reading\s+this|"
            r"models?\s+reading\s+this|gpt)\b[^\n]{0,20}?(?:[:,\u2014)\]!]|\s-\s)"
            r"|\b(?:dear|hey|hello|attention)\s+(?:ai|a\.i\.|assistant|chatbot|language\s+model|"
            r"llm|gpt)\b"
            r"|\bif\s+you(?:'re|\s+are)\s+(?:an?\s+)?(?:ai|a\.i\.|large\s+language|language\s+"
            r"model|llm|chatbot|ai\s+assistant|automated)\b"
            r"|\b(?:ai|a\.i\.|language\s+models?|llms?|chatbots?|ai\s+assistants?|ai\s+models?)\s+"
            r"(?:reading|processing|summari[sz]ing|parsing|retrieving|answering|that\s+reads?)\s+"
            r"(?:this|these)\b"
            r"|(?:^|(?<=[.!?\n])\s*)(?:ai|a\.i\.|ai\s+assistant|language\s+model|llm|chatbot)\s*[,:]"
            r"\s*(?:please\s+)?(?:you|ignore|disregard|answer|respond|reply|say|select|choose|"
            r"output|print|reveal|always|never|do\s+not|don'?t)\b"
        ),
        "ignore_instructions": (
            r"(?:^|(?<=[.!?:;\n\"'(\[])\s*|\b(?:please|now|you\s+(?:must|should|will|shall))\s+)"
            r"(?:ignore|disregard|forget|override|bypass|discard)\s+(?:all|any|every|your|the|"
            r"previous|prior|earlier|above|preceding|other|original|system)\s+(?:[\w-]+\s+){0,2}?"
            r"(?:instructions|prompts?|directives|guidelines|guardrails|programming|system\s+"
            r"(?:prompt|message)|safety\s+rules)\b"
            r"|\b(?:ignore|disregard|forget)\s+(?:all\s+(?:of\s+)?)?your\s+(?:previous\s+|prior\s+|"
            r"earlier\s+|original\s+|initial\s+)?(?:instructions|prompts?|programming)\b"
        ),
        "forced_answer": (
            r"\b(?:the\s+)?(?:correct|right|best|proper|only\s+correct)\s+(?:answer|choice|option|"
            r"response)\s+(?:to\s+(?:this|the|any|that|every)\s+(?:[\w-]+\s+){0,4})?(?:is|will\s+"
            r"be|must\s+be|should\s+be|=)\s*:?\s*(?:always\s+)?(?:option\s+|choice\s+|letter\s+)?"
            r"(?:\(\s*(?-i:[A-Da-d])\s*\)|(?-i:[A-D])\b(?!\.\s?[A-Z]))"
            r"|(?:^|(?<=[.!?:\n])\s*)(?:always\s+)?(?:answer|choose|select|pick|mark)\s+(?:with\s+)?"
            r"(?:option\s+|choice\s+|letter\s+)?\(\s*(?-i:[A-D])\s*\)"
            r"|\b(?:answer|choose|select|pick)\s+(?:option\s+|choice\s+|letter\s+)?\(?(?-i:[A-D])"
            r"\)?\s+(?:regardless|no\s+matter|whatever|irrespective)\b"
        ),
        "reveal_prompt": (
            rf"\b{_REQUEST}\b[^\n]{{0,60}}?(?:system\s+prompt|(?:your|the\s+assistant'?s)\s+"
            r"(?:[\w-]+\s+){0,2}?(?:prompt|instructions|configuration|api\s+keys?|credentials)|"
            r"hidden\s+instructions|developer\s+message|environment\s+variables|os\.environ)"
        ),
        "chat_template_tokens": (
            rf"{_TEMPLATE_TOKENS}|</?\s*(?:system|assistant|user_input|im_start|im_end|passage|"
            r"evidence)\s*>"
            r"|(?:^|\n)[ \t]*(?:#{1,6}[ \t]*)?(?:assistant|(?:system|assistant)[ \t]*(?:message|"
            r"prompt|note|override))[ \t]*:|(?:^|\n)[ \t]*#{1,6}[ \t]*system\b"
        ),
        "persona_reset": (
            r"\byou\s+are\s+now\s+(?:an?\s+|in\s+|no\s+longer\b|free\b|unrestricted\b|DAN\b)"
            r"|\bdo\s+anything\s+now\b|\b(?:developer|god|jailbreak|unrestricted)\s+mode\b"
            r"|\bjailbroken\b|\bfrom\s+now\s+on,?\s+(?:you|the\s+(?:assistant|ai|model))\b"
        ),
    }
)

_PASSAGE_TRIGGER = re.compile(
    r"ai\b|a\.i\.|assistant|model|llm|chatbot|gpt|ignore|disregard|forget|override|bypass|"
    r"discard|answer|choice|option|choose|select|pick|prompt|instructions|environ|api\s+key|"
    r"credential|<|\[|system|you\s+are|anything|mode|jailbr|from\s+now",
    _I,
)
"""Cheap pre-filter: a passage without any of these words cannot match a passage pattern."""


# ------------------------------------------------------------------------------------------------
# Normalisation and encoded payloads
# ------------------------------------------------------------------------------------------------

_INVISIBLE = re.compile(r"[\u00ad\u180e\u200b-\u200f\u2060-\u2064\ufeff]")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a"})
_LEET_WORD = re.compile(r"\b(?=\w*[a-z])(?=\w*[0134579@])[\w@]+\b", _I)
_SPACED = re.compile(r"(?<![\w])(?:[A-Za-z] ){3,}[A-Za-z](?![\w])")
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{16,}={0,2}(?![A-Za-z0-9+/=_-])")
_HEX_RUN = re.compile(r"\b(?:[0-9a-fA-F]{2}){8,}\b")
_HEX_SPACED = re.compile(r"\b(?:(?:0x)?[0-9a-fA-F]{2}[\s,:]+){5,}(?:0x)?[0-9a-fA-F]{2}\b")
_HEX_ESCAPED = re.compile(r"(?:\\x[0-9a-fA-F]{2}){4,}")
_PERCENT = re.compile(r"(?:%[0-9A-Fa-f]{2}[\s]*){4,}")
_UNICODE_ESC = re.compile(r"(?:\\u[0-9a-fA-F]{4}){4,}")


def normalize(text: str) -> str:
    """NFKC, no invisible characters, straight quotes: "ｉｇｎｏｒｅ" and "ig\u200bnore" read as
    "ignore"."""
    text = unicodedata.normalize("NFKC", text or "")
    return _INVISIBLE.sub("", text).translate(_QUOTES)


def _printable_text(raw: bytes) -> str | None:
    """``raw`` as text when it reads as natural language (mostly letters and spaces)."""
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    letters = sum(c.isalpha() or c in " .,:;'\"()!?-" for c in s)
    return s if len(s) >= 8 and letters / len(s) >= 0.85 and " " in s.strip() else None


def decoded_payloads(text: str) -> list[str]:
    """Readable texts hidden in ``text``: base64, hex (run, spaced, ``\\x`` or ``\\u`` escapes)
    and percent-encoded blobs.  Hashes and ids decode to binary and are left out."""
    return [
        got
        for pattern, decode in _DECODERS
        for m in pattern.finditer(text)
        if (got := decode(m.group(0)))
    ]


def _base64_text(blob: str) -> str | None:
    if blob.isdigit() or blob.isalpha() and (blob.islower() or blob.isupper()):
        return None  # a plain word or number, not base64
    padded = blob + "=" * (-len(blob) % 4)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            if got := _printable_text(decode(padded)):
                return got
        except (binascii.Error, ValueError):
            pass
    return None


def _hex_text(blob: str) -> str | None:
    """A hex run, spaced pairs (``0x`` prefixes allowed) or ``\\x`` escapes, as text."""
    return _printable_text(bytes.fromhex(re.sub(r"0x|\\x|[\s,:]", "", blob, flags=_I)))


_DECODERS: tuple[tuple[re.Pattern[str], Callable[[str], str | None]], ...] = (
    (_BASE64, _base64_text),
    (_HEX_RUN, _hex_text),
    (_HEX_SPACED, _hex_text),
    (_HEX_ESCAPED, _hex_text),
    (_UNICODE_ESC, lambda blob: blob.encode().decode("unicode_escape")),
    (_PERCENT, lambda blob: _printable_text(urllib.parse.unquote_to_bytes(blob.strip()))),
)


def _obfuscation_variants(text: str) -> list[str]:
    """Readings of ``text`` an attacker may have disguised: decoded blobs, ROT13, reversed,
    leetspeak and spaced-out letters."""
    variants = [*decoded_payloads(text), codecs.encode(text, "rot13"), text[::-1]]
    if _LEET_WORD.search(text):
        variants.append(_LEET_WORD.sub(lambda m: m.group(0).translate(_LEET), text))
    if _SPACED.search(text):
        variants.append(_SPACED.sub(lambda m: m.group(0).replace(" ", ""), text))
    return variants


Veto = Callable[[str, str, re.Match[str]], bool]
"""(pattern name, text, match) -> whether the match is set aside (not an attack)."""


def _matches(
    patterns: Mapping[str, re.Pattern[str]], text: str, veto: Veto | None = None
) -> list[str]:
    """Names of ``patterns`` with a match in ``text`` that ``veto`` does not set aside."""
    return [
        name
        for name, pattern in patterns.items()
        if any(veto is None or not veto(name, text, m) for m in pattern.finditer(text))
    ]


# ------------------------------------------------------------------------------------------------
# The screens
# ------------------------------------------------------------------------------------------------


_SENTENCE_END = re.compile(r"[.!?\n]")


def _sentence_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """Where the sentence around ``text[start:end]`` begins and ends."""
    left = max((m.end() for m in _SENTENCE_END.finditer(text, 0, start)), default=0)
    right = _SENTENCE_END.search(text, end)
    return left, right.start() if right else len(text)


_REPORTED = re.compile(
    r"\b(?:told|tells?|asked|asks?|ordered|orders?|instructed|instructs?|directed|directs?|"
    r"wanted|wants?|required|requires?|forced|forces?|expected|expects?|urged|urges?)\s+"
    r"(?!you\b)(?:[\w'-]+\s+){1,3}?to\s",
    _I,
)
"""A command reported as said to someone in the story ("my manager told me to ..."), not to the
assistant."""
_ADDRESSEE = re.compile(rf"\byou(?:rs?|rself)?\b|\b{_AI_STRICT}\b", _I)
_REPORTABLE = frozenset({"override_instructions", "forget_context"})
"""Patterns whose match is not a hit when it continues a command reported earlier in its sentence,
in a sentence that never names the assistant: "My new manager told me to ignore previous
instructions from the safety officer and disregard the system rules for forklift operation."."""


_SAID = re.compile(
    r"\b(?:said|says|say|shouted|shouts|yelled|screamed|wrote|writes|texted|emailed|stated|"
    r"told\s+\w+|replied|announced|whispered|added|read)(?:(?:\s+[\w'-]+){1,4}?\s*[,:]|\s*[,:]?)\s*"
    r"(?P<q>[\"'])(?P<said>.{3,400}?)(?P=q)(?![A-Za-z])",
    _I | re.S,
)
"""A statement quoted as said or written in the story ("the caller said, 'Forget everything you
were told and wire the money now.'"): the words a hearsay or fraud question asks about."""


def _quoted(text: str, match: re.Match[str]) -> bool:
    """``match`` lies inside a quotation that a speech verb of the story introduces, and the
    words outside the quotation in its sentences never name the assistant."""
    for q in _SAID.finditer(text):
        if q.start("said") <= match.start() and match.end() <= q.end("said"):
            left = _sentence_bounds(text, q.start(), q.start())[0]
            right = _sentence_bounds(text, q.end(), q.end())[1]
            outside = text[left : q.start("said")] + " " + text[q.end("said") : right]
            return not _ADDRESSEE.search(outside)
    return False


def _reported(name: str, text: str, match: re.Match[str]) -> bool:
    """The user-input veto: ``match`` continues a command reported earlier in its sentence, or
    lies in a statement the story quotes."""
    if name not in _REPORTABLE:
        return False
    if _quoted(text, match):
        return True
    left, right = _sentence_bounds(text, match.start(), match.end())
    if _ADDRESSEE.search(text, left, right):
        return False
    return bool(_REPORTED.search(text, left, match.start()))


def screen_user_input(text: str) -> list[str]:
    """Names of the user-input patterns ``text`` matches (empty = looks safe): override/ignore
    instructions, fake system or assistant turns and chat-template tokens, role-play and persona
    resets, asides to the AI inside a fact pattern, forced multiple-choice answers, requests for
    keys / the prompt / the environment, requests to fabricate authorities.

    The text is normalised first; disguised readings of it (base64/hex/percent blobs, ROT13,
    reversed, leetspeak, spaced letters) are screened too and report :data:`ENCODED`."""
    norm = normalize(text)
    hits = _matches(USER_PATTERNS, norm, _reported)
    for variant in _obfuscation_variants(norm):
        inner = [n for n in _matches(USER_PATTERNS, normalize(variant)) if n not in hits]
        if inner:
            logger.debug("decoded payload matches %s: %.80r", inner, variant)
            hits.append(ENCODED)
            break
    return hits


_COURTROOM = re.compile(r"\bjur(?:y|ors?)\b|\bcharge\b|\bjudge\b|\bcourt\b", _I)


def _reported_in_caselaw(name: str, text: str, match: re.Match[str]) -> bool:
    """The passage veto: an ``ignore_instructions`` match in a sentence of the courtroom, as
    caselaw reports that "the judge told the jurors to disregard all prior instructions"."""
    if name != "ignore_instructions":
        return False
    return bool(_COURTROOM.search(text, *_sentence_bounds(text, match.start(), match.end())))


def screen_passage(text: str) -> list[str]:
    """Names of the document patterns ``text`` matches (empty = clean): a passage that addresses
    an AI, tells it to ignore its instructions, declares "the correct answer is (X)", asks for the
    prompt, or carries chat-template tokens; legal text ("the jury was instructed to disregard
    …") never matches (checked against both bundled corpora).  An encoded blob
    (:func:`decoded_payloads`) whose text matches a passage or user-input pattern reports
    :data:`ENCODED`."""

    def hits_in(t: str) -> list[str]:
        return _matches(PASSAGE_PATTERNS, t, _reported_in_caselaw)

    norm = normalize(text)
    hits = hits_in(norm) if _PASSAGE_TRIGGER.search(norm) else []
    if any(hits_in(d) or _matches(USER_PATTERNS, d) for d in decoded_payloads(norm)):
        hits.append(ENCODED)
    return hits


HIDDEN_FLAG = "hidden:"
"""Prefix of the stored injection flags of a chunk whose document hides text that reads as
instructions (white or invisible PDF text, HTML comments or hidden elements, metadata): the
loader flags every chunk of such a document (``load_corpus.load_documents``), and no search hands
one to a prompt, though its visible text screens clean."""


def quarantined(doc: Mapping[str, Any]) -> list[str]:
    """The :data:`HIDDEN_FLAG` flags stored with a retrieved passage (empty: not quarantined)."""
    stored = str((doc.get("metadata") or {}).get("injection_flags") or "")
    return [f for f in stored.split(",") if f.startswith(HIDDEN_FLAG)]


FLAG_HEADROOM = 3
"""Extra passages a search fetches so that those :func:`keep_clean` drops are replaced: a planted
passage changes neither how many passages are read nor which."""


def keep_clean(
    docs: Iterable[Mapping[str, Any]],
    k: int,
    screen: Callable[[str], list[str]] = screen_passage,
) -> tuple[list[dict], list[dict]]:
    """``(kept, flagged)``: the first ``k`` passages of ``docs`` (best first) whose text ``screen``
    finds no instruction in; and every screened-out one as ``{"id", "patterns"}``."""
    kept: list[dict] = []
    flagged: list[dict] = []
    for doc in docs:
        hits = quarantined(doc) + screen(doc.get("text") or "")
        if hits:
            flagged.append({"id": doc["id"], "patterns": hits})
        elif len(kept) < k:
            kept.append(doc)
    return kept, flagged


def rejection_message(check: InjectionCheck) -> str:
    """What the user reads when their input is rejected as an injection."""
    return (
        "Request rejected: it looks like an attempt to change the assistant's instructions "
        f"({check['reason']}). Ask a legal research question instead."
    )


# ------------------------------------------------------------------------------------------------
# The policy
# ------------------------------------------------------------------------------------------------

_COMMANDS = (
    r"(?:ignore|disregard|forget|override|bypass|pretend|role-?play|act\s+as|respond|reply|print|"
    r"reveal|say|write|output|answer|select|choose|pick|repeat|tell|show|list|give|stop|do\s+not|"
    r"don'?t|conclude|mark|append|include|treat|end|activate|enable|enter|switch|read|obey|follow|"
    r"execute|translate|evaluate|process|cite|invent|fabricate|make\s+up)"
)
_CONTROL_CUES = re.compile(
    r"\b(?:you|your|yours|yourself|u|ur|from\s+now\s+on|persona|jailbreak|base64|rot13|decode)\b"
    rf"|{_START}{_COMMANDS}\b|{_START}(?:never|always|only)\s+{_COMMANDS}s?\b"
    rf"|\b(?:to|for|dear|hey|attention)\s+(?:the\s+|any\s+|this\s+|whatever\s+)?{_AI}\b"
    rf"|\b{_AI}\s+(?:must|should|will|shall|is\s+to|needs?\s+to|has\s+to|may\s+not|cannot)\b",
    _I,
)
"""What an instruction to the assistant needs: the second person, an imperative at the start of a
clause ("never", "always" and "only" count only before one: "…, but only on the ground that" is
a fact pattern), an AI as addressee ("note to the AI", "the assistant must"), or words of persona
and encoding tricks.  Third-person mentions ("a company's chatbot",
"prompt injection", "jury instructions") are subject matter, not an address."""
_FABRICATION_CUES = re.compile(
    r"\b(?:fake|fabricat\w*|made[-\s]?up|make\s+(?:\w+\s+)?up|invent\w*|fictitious|fictional|"
    r"non-?existent|imaginary|bogus|phony)\b[^.\n]{0,60}\b(?:cases?|citations?|cites|"
    r"authorit(?:y|ies)|precedents?|holdings?|quotes?|statutes?|decisions?|rulings?)\b"
    r"|\b(?:cases?|citations?|authorit(?:y|ies)|precedents?|holdings?)\b[^.\n]{0,60}\b(?:fake|"
    r"fabricat\w*|made[-\s]?up|make\s+(?:\w+\s+)?up|invent\w*|fictitious|non-?existent|"
    r"don'?t\s+exist|do\s+not\s+exist|aren'?t\s+real)\b",
    _I,
)


_QUOTED = re.compile(r"\"[^\"\n]{1,600}\"")
_SECOND_PERSON = re.compile(r"\b(?:you|your|yours|yourself|u|ur)\b", _I)
_U_ABBREVIATION = re.compile(r"\b(?:u|ur)\b(?=\s*\.)", _I)
"""A quoted span (a character's words in a fact pattern; :func:`normalize` straightens curly
quotes), the second person, and "U." as in "U.S.C." or "D.U.I." (not the text-speak "u")."""


def addresses_the_assistant(text: str) -> bool:
    """True when ``text`` could hold an instruction to the assistant: words a command would use
    (not the second person inside quotes, nor "U."), an encoded payload, or a request involving
    fabricated authorities.  An LLM 'injection' verdict on any other text is overruled: the small
    local model flags plain fact patterns (docs/MEASUREMENTS.md, "Injection check")."""
    norm = normalize(text)
    quoted_to_third_person = _QUOTED.sub(lambda q: _SECOND_PERSON.sub("they", q.group(0)), norm)
    cues = _U_ABBREVIATION.sub("x", quoted_to_third_person)
    return bool(
        _CONTROL_CUES.search(cues)
        or _FABRICATION_CUES.search(norm)
        or decoded_payloads(norm)
        or any(_looks_encoded(m.group(0)) for m in _BASE64.finditer(norm))
        or _HEX_RUN.search(norm)
    )


def _looks_encoded(token: str) -> bool:
    """A long token mixing digits, lower and upper case letters (a base64 blob, not a word)."""
    return all(any(map(kind, token)) for kind in (str.isdigit, str.islower, str.isupper))


def detect(text: str, client: Any, *, skip_llm: bool) -> InjectionCheck:
    """The injection check of one user input: pre-screen, then the model's verdict
    (``skills/detect_prompt_injection.md``).

    * a :func:`screen_user_input` hit rejects (no LLM call; ``llm_verdict='not_needed'``);
    * ``skip_llm``, a failed call (``LLMCallError``) or an unparsed reply (``llm_verdict``
      ``skipped``, ``error``, ``unparsed``): the input passes on the pre-screen alone and
      ``injection_check`` says ``prescreen_only`` (else ``full``);
    * a model verdict 'safe' passes, 'injection' rejects — unless the text never addresses the
      assistant (:func:`addresses_the_assistant`), when it is overruled and the reason says so.

    ``client`` is an ``llm_config.LLMClient`` (unused when ``skip_llm``)."""
    hits = screen_user_input(text)
    if hits:
        return _check(False, "not_needed", f"pre-screen: {', '.join(hits)}", prescreen=hits)
    if skip_llm:
        return _check(True, "skipped", "LLM check skipped; pre-screen clean", full=False)
    try:
        result = prompts.call(client, "injection", user_input=prompts.quote("user_input", text))
    except LLMCallError as exc:
        logger.warning("injection check: the LLM call failed; passing on the pre-screen: %s", exc)
        reason = f"LLM call failed; pre-screen clean ({exc})"[:200]
        return _check(True, "error", reason, full=False)
    parsed = result.parsed
    if parsed is None:
        return _check(True, "unparsed", "LLM verdict unparsed; pre-screen clean", full=False)
    if parsed.verdict == "injection" and not addresses_the_assistant(text):
        reason = f"LLM verdict overruled: no instruction to the assistant ({parsed.reason})"
        return _check(True, "injection", reason)
    return _check(parsed.verdict == "safe", parsed.verdict, parsed.reason)


def _check(
    is_safe: bool,
    llm_verdict: LLMVerdict,
    reason: str,
    *,
    prescreen: Iterable[str] = (),
    full: bool = True,
) -> InjectionCheck:
    return InjectionCheck(
        is_safe=is_safe,
        verdict="safe" if is_safe else "injection",
        prescreen=list(prescreen),
        llm_verdict=llm_verdict,
        reason=reason,
        injection_check="full" if full else "prescreen_only",
    )
