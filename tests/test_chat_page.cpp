// The chat page of `specrun serve` (GET /) in a real browser: headless Chromium, driven through
// Selenium by tests/server/chat_page_check.py, asks the bundled pair (models/pycode-*) a question
// on the page and reads the streamed answer back from it. The answer must be the server's own (the
// same request through the API, greedy, not streamed), coloured by where its text came from, with
// the acceptance rate and tokens per second shown. Skips without Debian's chromium and
// chromium-driver (tools/install-deps.sh --tests) or the venv's selenium (tools/setup-python.sh
// browser). With SPECRUN_CHAT_PAGE_SCREENSHOT=FILE it also saves a screenshot of the page there.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include <httplib.h>

#include "runtime/server/server.h"
#include "tests/test_support.h"

namespace specrun::server {
namespace {

using namespace std::chrono_literals;

// The bundled pair completes Python code: the "conversation" is the code so far, as written.
constexpr const char* kChatTemplate =
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}";

TEST(ChatPage, AnswersInTheBrowserAsTheApiDoesColouredByOrigin) {
  for (const char* program : {"/usr/bin/chromium", "/usr/bin/chromedriver"}) {
    if (!std::filesystem::exists(program)) {
      GTEST_SKIP() << program << " is not installed (tools/install-deps.sh --tests)";
    }
  }
  const std::string python = testing::venv_python_with("selenium");
  if (python.empty()) {
    GTEST_SKIP() << "the selenium package is not installed (tools/setup-python.sh browser)";
  }
  testing::TempDir dir;
  testing::write_file(dir / "chat.jinja", kChatTemplate);
  EngineConfig engine;
  engine.target = testing::source_path("models/pycode-target").string();
  engine.draft = testing::source_path("models/pycode-draft").string();
  engine.threads = 2;
  // Drafts in every step, however the steps' costs fall on this machine: the page has both
  // origins to colour.
  engine.speculation.controller = GammaControl::kFixed;
  engine.speculation.gamma = 4;
  ServerConfig config;
  config.port = 0;
  Server server(config, engine);
  auto loaded = Engine::create(engine);
  std::optional<ChatTemplate> chat_template =
      ChatTemplate::load(loaded->info(), (dir / "chat.jinja").string());
  server.attach(std::move(loaded), std::move(chat_template), "pycode");
  std::thread listener([&] { server.listen(); });
  httplib::Client http("127.0.0.1", server.port());
  for (int i = 0; i < 500 && !http.Get("/health"); ++i) std::this_thread::sleep_for(10ms);

  std::string command = "'" + python + "' '" +
                        testing::source_path("tests/server/chat_page_check.py").string() +
                        "' http://127.0.0.1:" + std::to_string(server.port()) +
                        " 'def fibonacci(n):' --max-tokens 48";
  if (const char* screenshot = std::getenv("SPECRUN_CHAT_PAGE_SCREENSHOT")) {
    command += " --screenshot '" + std::string(screenshot) + "'";
  }
  const testing::CommandResult check = testing::run_command(command);
  server.stop();
  listener.join();
  ASSERT_EQ(check.exit_code, 0) << check.stdout_text << check.stderr_text;
  const nlohmann::json shown = nlohmann::json::parse(check.stdout_text);
  EXPECT_FALSE(shown["answer"].get<std::string>().empty());
}

}  // namespace
}  // namespace specrun::server
