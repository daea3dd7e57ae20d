import copy
import json
import re
from importlib.resources import files

import pytest

from turborag_research.synth import parse_domains


def _shipped():
    path = files("turborag_research").joinpath("data/synth_domains.json")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(entity=["syllables"]), r"entity must be \[kind, \*arguments\], kind one of word"),
        (lambda d: d["templates"][2].update(value=["number", 10]), r"templates\[2\]\.value .*takes 2 to 3"),
        (lambda d: d["templates"][0].update(value=["number", 5, 1]), r"templates\[0\]\.value .*low <= high"),
        (lambda d: d["templates"][0].update(facts=["{e}."]), r"templates\[0\]\.facts: .* lacks \{v\}"),
        (lambda d: d["fillers"].append("{e} is near {v}."), r"fillers: .* uses \{v\}; only \{e\} here"),
        (lambda d: d.update(filers=d.pop("fillers")), r"the entry must be an object with keys"),
        (
            lambda d: d["templates"][2].update(units="people"),
            r"templates\[2\] must be an object with keys .* \(optional: unit\)",
        ),
        (lambda d: d["templates"][1].update(unit=""), r"templates\[1\]\.unit must be a non-empty string"),
    ],
)
def test_malformed_domain_names_the_domain(edit, message):
    data = _shipped()
    assert len(parse_domains(data)) == 10  # the shipped data itself is well-formed
    broken = copy.deepcopy(data)
    edit(broken["domains"][1])
    with pytest.raises(ValueError, match=re.escape("synth domain 'city': ") + message):
        parse_domains(broken)
