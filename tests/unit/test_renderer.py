"""backend/ui/renderer.py: Chainlit's script without the directive syntax and the alert pattern (#22)."""

from __future__ import annotations

import logging

from backend.ui import renderer

DIRECTIVE = "function xMn(){return{text:{58:yMn},flow:{58:[iMn,hMn]}}}function CMn(){}"
ALERT = 'I9n=()=>t=>{wC(t,"text",e=>{const n=' + renderer.ALERT_PATTERN + ",r=e.value.match(n)})}"


def test_the_directive_syntax_becomes_an_empty_extension_and_the_alert_pattern_never_matches():
    patched = renderer.without_directives("a;" + DIRECTIVE + ";" + ALERT + ";b")
    assert (
        patched
        == "a;function xMn(){return{}}function CMn(){};" + ALERT.replace(renderer.ALERT_PATTERN, renderer.NEVER) + ";b"
    )


def test_a_script_without_both_or_with_either_twice_is_left_alone():
    assert renderer.without_directives(DIRECTIVE) is None
    assert renderer.without_directives(ALERT) is None
    assert renderer.without_directives(DIRECTIVE + DIRECTIVE + ALERT) is None
    assert renderer.without_directives(DIRECTIVE + ALERT + ALERT) is None


def test_the_installed_chainlit_bundle_is_patched_once():
    (bundle,) = renderer.patched_bundles(renderer.chainlit_assets())
    text = bundle.body.decode()
    assert bundle.name.startswith("index-") and renderer.DIRECTIVE_SYNTAX.search(text) is None
    assert renderer.ALERT_PATTERN not in text and text.count(renderer.NEVER) == 1


def test_another_chainlit_without_the_syntax_is_served_as_shipped_and_said(tmp_path, caplog):
    (tmp_path / "index-x.js").write_text("console.log('text:{58:')")
    with caplog.at_level(logging.WARNING, logger="backend.ui.renderer"):
        assert renderer.patched_bundles(tmp_path) == ()
    assert "key:value may be shown cut" in caplog.text and str(tmp_path) in caplog.text
